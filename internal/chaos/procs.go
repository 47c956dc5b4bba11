package chaos

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
)

// module is the module path the binaries are built from.
const module = "github.com/gitea-dynamic-runner/gitea-dynamic-runner"

// Binaries are the programs a run starts, built once into one folder.
type Binaries struct {
	Dispatch, Handle, Recover, Gateway, NATS string
}

// Build builds dispatch, handle, recover and gateway (the project's own mains) and
// nats-server (the module's dependency) into dir with `go build`.
func Build(ctx context.Context, dir string) (Binaries, error) {
	b := Binaries{
		Dispatch: filepath.Join(dir, "dispatch"), Handle: filepath.Join(dir, "handle"),
		Recover: filepath.Join(dir, "recover"), Gateway: filepath.Join(dir, "gateway"), NATS: filepath.Join(dir, "nats-server"),
	}
	for _, args := range [][]string{
		{"build", "-o", dir + "/", module + "/functions/dispatch", module + "/functions/handle", module + "/functions/recover", module + "/functions/gateway"},
		{"build", "-o", b.NATS, "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go %v: %w\n%s", args, err, out)
		}
	}
	return b, nil
}

// Fleet runs the function processes of a run and kills them on demand. It
// only ever signals processes it started, by PID (each in a group of its
// own, see testenv.StartProcess).
type Fleet struct {
	env  []string
	logs string
	// endpoints gives each process its own endpoint of a peer (SetEndpoints).
	endpoints func(kind string) (env []string, endpoint string, err error)

	mu       sync.Mutex
	live     map[int]*member
	starts   map[string]int
	exits    map[string]int
	kills    map[string]int
	lives    []Life
	killNext int // processes to kill soon after they start
	rng      *mathrand.Rand
	closed   bool
}

type member struct {
	kind     string
	proc     *testenv.Process
	started  time.Time
	killed   bool
	endpoint string
}

// Life is one process of the fleet, from its start to its end.
type Life struct {
	Kind           string
	PID            int
	Started, Ended time.Time
	// Killed: it ended by the fleet's SIGKILL.
	Killed bool
	// Endpoint names the endpoint of a peer given to it alone (SetEndpoints),
	// "" if none.
	Endpoint string
}

// NewFleet returns a fleet whose processes get env (and nothing of the test's
// own environment) and append their output to <logs>/<kind>.log.
func NewFleet(env []string, logs string, seed uint64) *Fleet {
	return &Fleet{env: env, logs: logs, live: map[int]*member{}, starts: map[string]int{}, exits: map[string]int{},
		kills: map[string]int{}, rng: mathrand.New(mathrand.NewPCG(seed, 0x6b696c6c))}
}

// SetEndpoints has every process started from now on given its own endpoint
// of a peer: open is called before each start with the process's kind and
// returns the variables that name the endpoint to the process (added to its
// environment last, so they override the fleet's) and the endpoint's name,
// recorded as its Life.Endpoint ("" and no variables: none). Open must not
// return an endpoint it returned before.
func (f *Fleet) SetEndpoints(open func(kind string) (env []string, endpoint string, err error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endpoints = open
}

// ErrClosed is returned by Run once the fleet is closed.
var ErrClosed = errors.New("fleet closed")

// Run starts bin (its kind names its log) with extra environment, waits
// for it to exit, and returns its exit error (nil for status 0).
func (f *Fleet) Run(kind, bin string, extra []string, args ...string) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return ErrClosed
	}
	open := f.endpoints
	f.mu.Unlock()
	var endpointEnv []string
	var endpoint string
	if open != nil {
		var err error
		if endpointEnv, endpoint, err = open(kind); err != nil {
			return fmt.Errorf("%s: its endpoint: %w", kind, err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(f.logs, kind+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = slices.Concat(f.env, extra, endpointEnv)
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := testenv.StartProcess(cmd)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.live[p.PID()] = &member{kind: kind, proc: p, started: time.Now(), endpoint: endpoint}
	f.starts[kind]++
	killSoon := f.killNext > 0 && !f.closed
	var after time.Duration
	if killSoon {
		f.killNext--
		after = time.Duration(f.rng.IntN(300)) * time.Millisecond
	}
	f.mu.Unlock()
	if killSoon {
		go func() {
			select {
			case <-time.After(after):
				f.kill(p.PID())
			case <-p.Exited():
			}
		}()
	}
	<-p.Exited()
	f.mu.Lock()
	m := f.live[p.PID()]
	f.lives = append(f.lives, Life{Kind: kind, PID: p.PID(), Started: m.started, Ended: time.Now(), Killed: m.killed, Endpoint: m.endpoint})
	delete(f.live, p.PID())
	f.exits[kind]++
	f.mu.Unlock()
	if !cmd.ProcessState.Success() {
		return &exec.ExitError{ProcessState: cmd.ProcessState}
	}
	return nil
}

// kill SIGKILLs the live member pid and counts it; false if it is gone.
func (f *Fleet) kill(pid int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.live[pid]
	if !ok || f.closed {
		return false
	}
	select {
	case <-m.proc.Exited():
		return false
	default:
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return false
	}
	m.killed = true
	f.kills[m.kind]++
	return true
}

// KillRandom SIGKILLs one live process chosen at random and reports whether
// there was one.
func (f *Fleet) KillRandom() bool {
	f.mu.Lock()
	pids := make([]int, 0, len(f.live))
	for pid := range f.live {
		pids = append(pids, pid)
	}
	var pid int
	if len(pids) > 0 {
		pid = pids[f.rng.IntN(len(pids))]
	}
	f.mu.Unlock()
	return pid != 0 && f.kill(pid)
}

// KillNextStart has the next process to start killed within 300 ms of its
// start.
func (f *Fleet) KillNextStart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killNext++
}

// Running counts the live processes of kind.
func (f *Fleet) Running(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.live {
		if m.kind == kind {
			n++
		}
	}
	return n
}

// Kills returns the kills so far, in all and by kind.
func (f *Fleet) Kills() (int, map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	by := map[string]int{}
	for k, v := range f.kills {
		n += v
		by[k] = v
	}
	return n, by
}

// Lives returns the processes of kind that have ended, in the order they
// ended.
func (f *Fleet) Lives(kind string) []Life {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Life
	for _, l := range f.lives {
		if l.Kind == kind {
			out = append(out, l)
		}
	}
	return out
}

// KindOf returns the kind of the ended process of the fleet that was given
// endpoint (SetEndpoints), "" if none was.
func (f *Fleet) KindOf(endpoint string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.lives {
		if endpoint != "" && l.Endpoint == endpoint {
			return l.Kind
		}
	}
	return ""
}

// Starts returns the processes started so far, by kind.
func (f *Fleet) Starts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	by := map[string]int{}
	for k, v := range f.starts {
		by[k] = v
	}
	return by
}

// Close starts nothing more, stops every live process (SIGTERM, then
// SIGKILL after grace) and waits for them.
func (f *Fleet) Close(grace time.Duration) {
	f.mu.Lock()
	f.closed = true
	var ps []*testenv.Process
	for _, m := range f.live {
		ps = append(ps, m.proc)
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { p.Stop(grace) })
	}
	wg.Wait()
}
