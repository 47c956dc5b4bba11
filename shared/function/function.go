// Package function is what every function's main shares: the common
// settings, the usage text drawn from the envconfig table, the logger, the
// HTTP listener with its timeouts and graceful shutdown, and the exit codes.
//
// A main is thin: it declares its Config (embedding Common, and HTTP if it
// listens), gives it a Check method for what envconfig cannot check, and
// hands Program.Main the work to do:
//
//	func main() {
//		var cfg Config
//		os.Exit(program.Main(&cfg, func(ctx context.Context, log *slog.Logger, args []string) error {
//			return serve(ctx, cfg, log)
//		}))
//	}
package function

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
)

// Exit codes of every function.
const (
	// ExitOK: everything asked for was done.
	ExitOK = 0
	// ExitFailed: the function could not do its work (the log says why).
	ExitFailed = 1
	// ExitConfig: bad configuration or usage; nothing was attempted.
	ExitConfig = 2
)

// CommonSettings is embedded in every function's configuration.
type CommonSettings struct {
	LogLevel slog.Level `envconfig:"GDR_LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// Level is the configured log level.
func (c CommonSettings) Level() slog.Level { return c.LogLevel }

// HTTPSettings is embedded in the configuration of every function that listens.
type HTTPSettings struct {
	HTTPAddr string `envconfig:"GDR_HTTP_ADDR" default:":8080" desc:"listen address of the HTTP server (dispatch: serve; handle and recover: http mode; gateway: always)"`
}

// Checker is implemented by a configuration (its pointer) that checks what
// envconfig cannot. Its errors name the variable at fault, never its value.
type Checker interface {
	Check() error
}

// Flagger is implemented by a configuration (its pointer) that takes flags
// over its environment variables: Flags defines them on fs with the values
// read from the environment as defaults.
type Flagger interface {
	Flags(fs *flag.FlagSet)
}

// LogFormatter is implemented by a configuration (its pointer) whose log
// format is a setting (local mode's --log-format): LogFormat returns "text"
// or "json", once the configuration is checked, and overrides
// Program.TextLog.
type LogFormatter interface {
	LogFormat() string
}

// UsageError is returned by a run for bad usage (an unknown command, a bad
// argument): Main prints it with the usage text and exits ExitConfig.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage wraps err as a UsageError.
func Usage(err error) error { return UsageError{Err: err} }

// Program describes one function's command line.
type Program struct {
	// Name is the command's name: the first word of its usage and the
	// "function" attribute of every log line.
	Name string
	// Synopsis follows the name in the usage line ("register | run | serve").
	Synopsis string
	// TextLog logs for a person at a terminal instead of in JSON.
	TextLog bool
	// Stdout receives what the command prints for its user (--version);
	// nil means os.Stdout.
	Stdout io.Writer
	// Commands are the command's subcommands, one of which must be the
	// first argument after the flags; none: it takes no argument. Load
	// refuses any other argument before it reads any configuration, so an
	// unknown command is said to be one, not a configuration error.
	Commands []string
}

// ErrVersion is returned by Load when --version was asked for: nothing was
// loaded or checked, so a binary answers it without any configuration.
var ErrVersion = errors.New("version requested")

// Load fills cfg (a pointer to an envconfig struct) from the GDR_*
// environment, refusing a renamed variable still set (renamedVars), parses
// args as flags over it (when cfg is a Flagger), then checks it (when cfg is
// a Checker). It returns the arguments left after the
// flags; flag.ErrHelp when help was asked for (the usage is printed);
// ErrVersion for --version; a UsageError for an argument that is not one of
// p.Commands, before any configuration error.
func (p Program) Load(cfg any, args []string, stderr io.Writer) ([]string, error) {
	envErr := envdoc.Process(cfg)
	if err := refuseRenamed(cfg); err != nil {
		envErr = err
	}
	fs := p.flagSet(cfg, stderr)
	version := fs.Bool("version", false, "print the version (module version, commit, Go version) and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *version {
		return nil, ErrVersion
	}
	if err := p.checkCommand(fs.Args()); err != nil {
		return nil, Usage(err)
	}
	if envErr != nil {
		return nil, envErr
	}
	if c, ok := cfg.(Checker); ok {
		if err := c.Check(); err != nil {
			return nil, err
		}
	}
	return fs.Args(), nil
}

// checkCommand refuses args whose first word is not one of p.Commands (or,
// when p has none, any argument at all). The arguments after a command are
// the command's to check.
func (p Program) checkCommand(args []string) error {
	if len(p.Commands) == 0 {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q (%s takes none)", args[0], p.Name)
		}
		return nil
	}
	if len(args) == 0 {
		return errors.New("no command")
	}
	for _, c := range p.Commands {
		if args[0] == c {
			return nil
		}
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// flagSet is the command line of cfg: its flags, and its usage on stderr.
func (p Program) flagSet(cfg any, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { p.usage(fs, cfg) }
	if f, ok := cfg.(Flagger); ok {
		f.Flags(fs)
	}
	return fs
}

func (p Program) usage(fs *flag.FlagSet, cfg any) {
	w := fs.Output()
	fmt.Fprintf(w, "usage: %s", p.Name)
	if p.Synopsis != "" {
		fmt.Fprintf(w, " %s", p.Synopsis)
	}
	fmt.Fprintln(w)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprintf(w, "\nFlags:\n")
		fs.PrintDefaults()
	}
	fmt.Fprintf(w, "\nConfigured by environment variables:\n")
	_ = envdoc.Usage(w, cfg)
}

// Logger returns the logger of the function at level, writing to w.
func (p Program) Logger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if p.TextLog {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts)).With(slog.String("function", p.Name))
}

// Run is a function's work, given a context that ends on SIGTERM or an
// interrupt, its logger and the arguments left after the flags.
type Run func(ctx context.Context, log *slog.Logger, args []string) error

// Main loads cfg from the environment and the command line, then runs run,
// and returns the exit code: ExitConfig when the configuration or usage is
// bad (said on stderr, never echoing a value), ExitFailed when run fails (it
// is logged), ExitOK otherwise, and after -h or --version (which need no
// configuration).
func (p Program) Main(cfg any, run Run) int {
	return p.Exec(context.Background(), cfg, os.Args[1:], os.Stderr, run)
}

// Exec is Main with the context, the arguments (without the program name)
// and the standard error given: for a test that runs a function's command
// line in process.
func (p Program) Exec(ctx context.Context, cfg any, args []string, stderr io.Writer, run Run) int {
	rest, err := p.Load(cfg, args, stderr)
	var usage UsageError
	switch {
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %v\n", p.Name, err)
		p.flagSet(cfg, stderr).Usage()
		return ExitConfig
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, ErrVersion):
		out := p.Stdout
		if out == nil {
			out = os.Stdout
		}
		PrintVersion(out, p.Name)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: configuration: %v\n", p.Name, err)
		return ExitConfig
	}
	level := slog.LevelInfo
	if l, ok := cfg.(interface{ Level() slog.Level }); ok {
		level = l.Level()
	}
	if f, ok := cfg.(LogFormatter); ok {
		p.TextLog = f.LogFormat() == "text"
	}
	log := p.Logger(stderr, level)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = run(ctx, log, rest)
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %v\n", p.Name, err)
		p.flagSet(cfg, stderr).Usage()
		return ExitConfig
	default:
		log.Error(p.Name+" failed", slog.Any("error", err))
		return ExitFailed
	}
}
