// Package runner is the runner process that runs inside an executor and executes
// its one Gitea task; functions/runner (and local mode) only call Main.
//
// It reads its bootstrap values (CI_*: assignment, SPIFFE ID, capability,
// gateway URL, and optionally an SVID handed to it), then re-executes itself
// with them removed from the environment and passed through a pipe: act's
// host mode copies the runner's whole environment into every step, and
// unsetting a variable would leave it in /proc/<pid>/environ. It gets its
// X.509-SVID (from the values or the SPIFFE Workload API), fetches its task
// from the gateway over mTLS, runs it with act in host mode and reports it.
//
// Exit status: 0 once a result is reported (whatever the result), 1 when it
// could not report, 2 when it could not start (bootstrap, identity, task).
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/taskrun"
)

// Config is the configuration of runner that the executor image sets (not
// the per-task CI_* values), read from GDR_* variables.
type Config struct {
	function.CommonSettings

	WorkDir    string `envconfig:"GDR_WORK_DIR" default:"/tmp/gitea-dynamic-runner" desc:"runner: where tasks run and actions are cached"`
	StatusFile string `envconfig:"GDR_STATUS_FILE" desc:"runner: file the exit status is written to before exit (the process backend reads it)"`
}

// program is the runner's command line.
var program = function.Program{Name: "runner"}

// envSocket is the SPIFFE Workload API socket; read, then kept from steps.
const envSocket = "SPIFFE_ENDPOINT_SOCKET"

// values is everything the re-executed runner needs from its first self.
type values struct {
	bootstrap.Values
	SVIDCert, SVIDKey, SVIDBundle string
	JobImage                      string
	// JobServices and ServiceTimeout are the backend's CI_JOB_SERVICES and
	// CI_JOB_SERVICES_TIMEOUT, as set.
	JobServices, ServiceTimeout string
	Socket                      string
}

// host is what the backend told the runner about its executor. A service
// timeout that does not parse is left to the default.
func (v values) host() taskrun.Host {
	h := taskrun.Host{Image: v.JobImage}
	if v.JobServices != "" {
		h.Services = strings.Split(v.JobServices, ",")
	}
	if d, err := time.ParseDuration(v.ServiceTimeout); err == nil && d > 0 {
		h.ServiceTimeout = d
	}
	return h
}

// Main runs the runner with the command line args (without the program
// name) and returns its exit status. self is the argument list that starts
// this same runner again (the program and, for a multi-command binary, its
// subcommand): the runner re-executes itself with it.
func Main(self []string, args []string) int {
	if len(args) > 0 && args[0] == "install" {
		return install(args[1:], os.Stderr)
	}
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	fd := fs.Int("bootstrap-fd", -1, "internal: read the bootstrap values from this file descriptor")
	version := fs.Bool("version", false, "print the version (module version, commit, Go version) and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: runner\n       runner install <path>   copy this runner to <path> (mode 0755) and exit\n\nStarted by a backend with the CI_* bootstrap variables. Also configured by:\n")
		_ = envdoc.Usage(fs.Output(), &Config{})
	}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return function.ExitOK
	case err != nil:
		return function.ExitConfig
	case *version:
		function.PrintVersion(os.Stdout, "runner")
		return function.ExitOK
	case fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "runner: unknown command %q\n", fs.Arg(0))
		fs.Usage()
		return function.ExitConfig
	}
	if *fd < 0 {
		return scrubAndReexec(self)
	}
	v, err := secondSelf(*fd)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	var cfg Config
	if err := envdoc.Process(&cfg); err != nil {
		fmt.Fprintf(os.Stderr, "runner: configuration: %v\n", err)
		return 2
	}
	log := program.Logger(os.Stderr, cfg.LogLevel).
		With(slog.String("assignment", v.AssignmentID), slog.Int64("task", v.TaskID))
	// act and the reporter log through logrus' standard logger: their lines
	// go into this log, in its format.
	logrusInto(logrus.StandardLogger(), log.Handler())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, cfg, v, log)
	stop()
	if cfg.StatusFile != "" {
		if err := writeStatus(cfg.StatusFile, code); err != nil {
			log.Error("write the exit status", slog.Any("error", err))
		}
	}
	return code
}

// writeStatus records the exit status atomically.
func writeStatus(path string, code int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d\n", code)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// secretVars are removed from the environment before any step can see it.
func secretVars() []string {
	return append(bootstrap.Variables(), bootstrap.EnvSVIDCert, bootstrap.EnvSVIDKey, bootstrap.EnvSVIDBundle, bootstrap.EnvJobImage,
		bootstrap.EnvJobServices, bootstrap.EnvServiceTimeout, envSocket)
}

// scrubAndReexec reads the bootstrap values, and executes this program again
// with an environment without them, handing them over through a descriptor
// that survives the exec (see handoverFD).
func scrubAndReexec(self []string) int {
	b, err := bootstrap.Read(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	v := values{Values: b, SVIDCert: os.Getenv(bootstrap.EnvSVIDCert), SVIDKey: os.Getenv(bootstrap.EnvSVIDKey),
		SVIDBundle: os.Getenv(bootstrap.EnvSVIDBundle), JobImage: os.Getenv(bootstrap.EnvJobImage),
		JobServices: os.Getenv(bootstrap.EnvJobServices), ServiceTimeout: os.Getenv(bootstrap.EnvServiceTimeout), Socket: os.Getenv(envSocket)}
	data, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	fd, err := handoverFD(data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: hand the bootstrap values over: %v\n", err)
		return 2
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !isSecretVar(name) {
			env = append(env, kv)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	argv := append(append([]string(nil), self...), fmt.Sprintf("-bootstrap-fd=%d", fd))
	err = syscall.Exec(exe, argv, env)
	fmt.Fprintf(os.Stderr, "runner: re-exec: %v\n", err)
	return 2
}

func isSecretVar(name string) bool {
	for _, s := range secretVars() {
		if name == s {
			return true
		}
	}
	return false
}

// secondSelf starts the re-executed runner: it makes itself non-dumpable,
// then reads the bootstrap values from the descriptor fd. From then on the
// runner's memory (its SVID key, its capability) is closed to its job's
// steps, processes of its own user: they can neither ptrace it nor read
// /proc/<runner>/mem. The runner never executes anything itself again,
// which would make it dumpable anew.
func secondSelf(fd int) (values, error) {
	if err := undump(); err != nil {
		return values{}, fmt.Errorf("close the runner's memory to its steps: %w", err)
	}
	return readValues(fd)
}

func readValues(fd int) (values, error) {
	f := os.NewFile(uintptr(fd), "bootstrap")
	if f == nil {
		return values{}, fmt.Errorf("bootstrap descriptor %d is not open", fd)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxValues+1))
	if err == nil && len(data) > maxValues {
		err = fmt.Errorf("more than %d bytes", maxValues)
	}
	if err != nil {
		return values{}, fmt.Errorf("read the bootstrap values: %w", err)
	}
	var v values
	if err := json.Unmarshal(data, &v); err != nil {
		return values{}, errors.New("the bootstrap values do not decode")
	}
	for _, name := range secretVars() {
		if _, ok := os.LookupEnv(name); ok {
			return values{}, fmt.Errorf("%s is still in the environment after the re-exec", name)
		}
	}
	return v, nil
}

// maxValues bounds the bootstrap values read back: an SVID, its key and a
// trust bundle of many authorities fit well inside.
const maxValues = 4 << 20

// startTimeout bounds getting an identity and the task.
const startTimeout = 2 * time.Minute
