package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// statusFileName is the file in the state directory where a running local
// mode keeps its status for `local status`: its embedded NATS server has
// no listener, so another process cannot read the queue itself.
const statusFileName = "status.json"

// statusFile is what the status file holds.
type statusFile struct {
	// PID is the local mode that wrote it: `local status` reports nothing
	// running when that process is gone (it was killed, or the machine
	// restarted).
	PID    int               `json:"pid"`
	Report poolstatus.Report `json:"report"`
}

// writeStatus reads the pool's status and replaces the status file with it
// (atomically: a reader never sees half of one). A failure is logged at
// debug level: the status is a convenience, never worth a warning a round.
func (l *local) writeStatus(ctx context.Context) {
	r, err := poolstatus.Read(ctx, l.statusSource, runnerpool.Pools{l.pool.Pool}, time.Now())
	if err == nil {
		err = writeStatusFile(l.cfg.StateDir, statusFile{PID: os.Getpid(), Report: r})
	}
	if err != nil && ctx.Err() == nil {
		l.log.Debug("status not written", slog.Any("error", err))
	}
}

func writeStatusFile(dir string, s statusFile) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, statusFileName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("status file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("status file: %w", err)
	}
	return nil
}

// removeStatus removes the status file as local mode stops: nothing of it
// runs any more (executors go on, and the next start reports them).
func removeStatus(dir string) {
	_ = os.Remove(filepath.Join(dir, statusFileName))
}

// runStatus is `local status [--state-dir DIR] [-o table|json]`: it prints
// the status a running local mode keeps in DIR, or that none runs there
// (exit 0 either way).
func runStatus(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("local status", flag.ContinueOnError)
	fset.SetOutput(stderr)
	dir := fset.String("state-dir", envOr("GDR_STATE_DIR", "./.gdr"), "state directory of the local mode to report on")
	format := function.OutputFlag(fset)
	switch err := fset.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return function.ExitOK
	case err != nil:
		return function.ExitConfig
	case fset.NArg() > 0:
		fmt.Fprintf(stderr, "local status: takes --state-dir DIR and -o table|json only\n")
		fset.Usage()
		return function.ExitConfig
	}
	s, running, err := readStatus(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "local status: %v\n", err)
		return function.ExitFailed
	}
	if !running {
		s = statusFile{Report: poolstatus.Report{Time: time.Now(), Pools: []poolstatus.Pool{}}}
		if *format == "table" {
			fmt.Fprintf(stdout, "no local mode is running with state directory %s\n", *dir)
			return function.ExitOK
		}
	}
	if err := s.Report.Write(stdout, *format); err != nil {
		fmt.Fprintf(stderr, "local status: %v\n", err)
		return function.ExitFailed
	}
	return function.ExitOK
}

// readStatus reads dir's status file; running is false when there is none
// or the process that wrote it is gone.
func readStatus(dir string) (statusFile, bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, statusFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return statusFile{}, false, nil
	}
	if err != nil {
		return statusFile{}, false, fmt.Errorf("status file: %w", err)
	}
	var s statusFile
	if err := json.Unmarshal(data, &s); err != nil {
		return statusFile{}, false, fmt.Errorf("status file %s: %w", filepath.Join(dir, statusFileName), err)
	}
	return s, alive(s.PID), nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}
