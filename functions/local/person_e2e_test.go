//go:build e2e

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitOutput waits until out holds want, at most timeout.
func waitOutput(t *testing.T, out *syncBuffer, want string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !strings.Contains(out.String(), want); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("local mode never said %q:\n%s", want, out.String())
		}
	}
}

// A second local mode on a state directory in use refuses to start and
// names the process that holds it; once that one is SIGKILLed, the next
// start on the directory succeeds at once (the kernel freed the lock; the
// lock file left behind blocks nothing).
func TestE2ELocalStateDirectoryLocked(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	first := startLocal(t, &out, s.args(true)...)
	waitOutput(t, &out, msgRunningLocal, 60*time.Second)

	// Without the lock the second one runs (a second NATS server on the
	// store): it is stopped after 30 s.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	second := exec.CommandContext(ctx, localBinary(t), "--gitea-url", s.gitea.URL, "--state-dir", s.state, "--gateway-addr", freeAddr(t))
	started := time.Now()
	said, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("a second local mode on %s = %v, want exit status 1:\n%s", s.state, err, said)
	}
	want := fmt.Sprintf("another local mode runs with state directory %s: process %d on ", s.state, first.Process.Pid)
	if !strings.Contains(string(said), want) {
		t.Fatalf("the second local mode said:\n%s\nwant %q", said, want)
	}
	t.Logf("refused in %v: %s", time.Since(started).Round(time.Millisecond), strings.TrimSpace(string(said)))

	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	var again syncBuffer
	restarted := time.Now()
	startLocal(t, &again, s.args(false)...)
	waitOutput(t, &again, msgRunningLocal, 30*time.Second)
	if strings.Contains(again.String(), "another local mode") {
		t.Fatalf("the restart after SIGKILL was refused:\n%s", again.String())
	}
	t.Logf("up again %v after the SIGKILL", time.Since(restarted).Round(time.Millisecond))
}

// With Gitea stopped for 20 s, local mode warns once that it is
// unreachable, asks less and less often (its failed rounds, at debug level,
// are a handful, not the 40 or more of the 500 ms pace), says once that it
// answers again after Gitea's restart, and then runs a job.
func TestE2ELocalGiteaOutage(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	startLocal(t, &out, s.args(true)...) // at debug level
	waitOutput(t, &out, msgRunningLocal, 60*time.Second)
	time.Sleep(time.Second)
	before := len(out.String())
	s.gitea.Stop(t)
	time.Sleep(20 * time.Second)
	during := out.String()[before:]
	// The fault happened: rounds failed.
	if !strings.Contains(during, "Gitea unreachable") {
		t.Fatalf("nothing said of Gitea being stopped:\n%s", during)
	}
	warnings, failedRounds := 0, 0
	for _, line := range strings.Split(during, "\n") {
		l := slogText(line)
		switch {
		case l["level"] == "WARN" || l["level"] == "ERROR":
			warnings++
			t.Logf("%s", line)
			if !strings.HasPrefix(l["msg"], "Gitea unreachable;") || l["gitea"] != s.gitea.URL {
				t.Errorf("warning %q, want it to say Gitea at %s is unreachable", line, s.gitea.URL)
			}
		case l["msg"] == "Gitea unreachable, again" && l["what"] == "dispatch round":
			failedRounds++
		}
	}
	t.Logf("20 s of Gitea down: %d warnings, %d more failed rounds", warnings, failedRounds)
	if warnings != 1 || failedRounds > 10 {
		t.Fatalf("20 s of Gitea down: %d warnings (want 1), %d more failed rounds (want at most 10: backing off)\n%s", warnings, failedRounds, during)
	}
	s.gitea.Restart(t)
	restarted := time.Now()
	waitOutput(t, &out, `msg="Gitea answers again"`, giteaBackoff+15*time.Second)
	t.Logf("Gitea answered again %v after its restart", time.Since(restarted).Round(100*time.Millisecond))
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, `msg="Gitea answers again"`) {
			t.Logf("%s", line)
		}
	}
	if n := strings.Count(out.String(), "Gitea answers again"); n != 1 {
		t.Fatalf("said %d times that Gitea answers again", n)
	}
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  ok:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo fine\n")
	if j := s.waitJob(t, "ok", completed, 60*time.Second, &out); j.Conclusion != "success" {
		t.Fatalf("ok = %+v", j)
	}
}

// A toolchain that builds with -buildvcs=false (GOFLAGS) records no commit:
// `go build` alone gives a --version without one; `make build` stamps it.
func TestE2ELocalVersionNamesTheCommit(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	commit := "commit " + strings.TrimSpace(string(head))
	bin := t.TempDir()
	env := append(os.Environ(), "GOFLAGS=-buildvcs=false")
	for _, tc := range []struct {
		name       string
		build      []string
		wantCommit bool
	}{
		{"go build", []string{"go", "build", "-o", filepath.Join(bin, "plain"), "./functions/local"}, false},
		{"make build", []string{"make", "build", "BIN=" + bin, "FUNCTIONS=local"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.build[0], tc.build[1:]...)
			cmd.Dir, cmd.Env = root, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", tc.build, err, out)
			}
			exe := filepath.Join(bin, "local")
			if !tc.wantCommit {
				exe = filepath.Join(bin, "plain")
			}
			out, err := exec.Command(exe, "--version").Output()
			if err != nil {
				t.Fatalf("--version: %v", err)
			}
			if got := strings.Contains(string(out), commit); got != tc.wantCommit {
				t.Fatalf("%s with -buildvcs=false: --version says %q; names %s: %v, want %v", tc.name, out, commit, got, tc.wantCommit)
			}
			t.Logf("%s: %s", tc.name, strings.TrimSpace(string(out)))
		})
	}
}

// In local mode a job's `container:` fails at once, and so does a
// `docker://` step on a machine without a Docker daemon (DOCKER_HOST names
// a socket that is not there), the job log saying why with the image named
// and what to do instead.
func TestE2ELocalContainerJobsSayWhy(t *testing.T) {
	noDaemon := filepath.Join(t.TempDir(), "docker.sock")
	t.Setenv("DOCKER_HOST", "unix://"+noDaemon)
	s := newSetup(t)
	var out syncBuffer
	startLocal(t, &out, s.args(true)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/ci.yml", `name: ci
on: [push]
jobs:
  incontainer:
    runs-on: ubuntu-latest
    container: node:20-bookworm
    steps:
      - run: node --version
  dockerstep:
    runs-on: ubuntu-latest
    steps:
      - name: lint
        uses: docker://alpine:3.20
`)
	for _, tc := range []struct{ job, want string }{
		{"incontainer", "this job asks for `container: node:20-bookworm`, but its executor is a process on this machine (local mode, or a process pool): no container, and no Docker daemon to start one; run it on a pod pool (the cluster path runs the job in node:20-bookworm)"},
		{"dockerstep", "step lint uses `docker://alpine:3.20`, an image to run with Docker, and this executor has no Docker daemon (no Docker daemon: nothing at " + noDaemon + ")"},
		{"dockerstep", "or in local mode on a machine with a Docker daemon (DOCKER_HOST, else /var/run/docker.sock)"},
	} {
		j := s.waitJob(t, tc.job, completed, 60*time.Second, &out)
		if j.Conclusion != "failure" {
			t.Fatalf("%s = %+v, want failure", tc.job, j)
		}
		logs := s.gitea.JobLogs(t, s.repo, j.ID)
		if !strings.Contains(logs, tc.want) || strings.Contains(logs, `runs ""`) {
			t.Fatalf("%s's log:\n%s\nwant it to say %q", tc.job, logs, tc.want)
		}
		t.Logf("%s: %s", tc.job, tc.want)
	}
}
