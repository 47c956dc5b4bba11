package clusterenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ClustersEnv names the most clusters that run on one machine at once
// (default DefaultClusters): StartWith waits for a free slot.
const ClustersEnv = "GDR_TEST_CLUSTERS"

// DefaultClusters is the most clusters at once when ClustersEnv is unset:
// deploy's cluster tests run two at a time (go test's -parallel, GOMAXPROCS
// on a 2-core machine), and one more lets another package's cluster test run
// beside them instead of after them.
const DefaultClusters = 3

// maxSlots bounds ClustersEnv: a slot names its clusters' addresses
// (10.254.<slot>.0/24 holds its nodes' /30s).
const maxSlots = 64

// machine is what the clusters on one machine share, kept in files of dir
// (os.TempDir()) so that every test process sees them:
//
//   - a slot each (gdr-clusterenv.slot<i>, an exclusive flock held until
//     Stop), at most max at once: a slot is the cluster's addresses, so two
//     clusters never share one;
//   - the kernel sysctls the kubelets change, which are not namespaced:
//     the first cluster to start records them (gdr-clusterenv.sysctls)
//     before its kubelet runs; every running cluster holds a shared flock on
//     LockFile; the cluster that stops while no other holds it is the last
//     and writes the record back. Taking the first and the last turn happens
//     under gdr-clusterenv.mutex, so no cluster starts between the last
//     one's check and its restore, and none records values a kubelet set.
//
// The watchdog inherits the slot's and LockFile's descriptors and takes the
// same last turn (watchdogScript), so a test binary that dies keeps both
// until its nodes' leftovers are gone and the sysctls are back.
type machine struct {
	dir     string
	procSys string   // "/proc/sys"
	sysctls []string // the names under procSys
	max     int
}

// clustersOnMachine is the machine of this process's clusters, max from
// ClustersEnv.
func clustersOnMachine() (machine, error) {
	m := machine{dir: os.TempDir(), procSys: "/proc/sys", sysctls: kubeletSysctls, max: DefaultClusters}
	if v := os.Getenv(ClustersEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSlots {
			return m, fmt.Errorf("%s=%q: want a number from 1 to %d", ClustersEnv, v, maxSlots)
		}
		m.max = n
	}
	return m, nil
}

func (m machine) path(name string) string { return filepath.Join(m.dir, "gdr-clusterenv."+name) }

// hold is one cluster's share of the machine, from takeSlot to release.
type hold struct {
	m       machine
	slot    int
	slotF   *os.File // exclusive flock: the slot
	running *os.File // shared flock on LockFile: a cluster runs
	// sysctls are the machine's values before the first of the clusters
	// running now started.
	sysctls map[string]string
	used    bool // a cluster started with it (Reserve's holds: at most one)
}

// reservedKey is the context key of Reserve's hold.
type reservedKey struct{}

// Reserve waits for a free cluster slot and returns parent carrying it:
// StartWith with that context (or one derived from it) starts its cluster
// in the slot instead of waiting for one, once. A test calls it before it
// sets its own timeout, so that the time it waits for another test's
// cluster to end is not taken from its own: the wait is bounded by the test
// binary's deadline (go test -timeout) only. The slot is free again when
// the cluster stops, or when t ends if no cluster took it.
func Reserve(parent context.Context, t testing.TB) context.Context {
	t.Helper()
	m, err := clustersOnMachine()
	if err != nil {
		t.Fatalf("clusterenv: %v", err)
	}
	return m.reserve(parent, t)
}

func (m machine) reserve(parent context.Context, t testing.TB) context.Context {
	t.Helper()
	ctx := parent
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(parent, deadline.Add(-time.Minute))
			defer cancel()
		}
	}
	t0 := time.Now()
	h, err := m.takeSlot(ctx)
	if err != nil {
		t.Fatalf("clusterenv: %v", err)
	}
	if w := time.Since(t0); w > time.Second {
		t.Logf("clusterenv: waited %v for a cluster slot (%s=%d)", w.Round(time.Second), ClustersEnv, m.max)
	}
	t.Cleanup(func() {
		if !h.used {
			h.slotF.Close()
		}
	})
	return context.WithValue(parent, reservedKey{}, h)
}

// reserved is ctx's hold from Reserve, if no cluster used it yet.
func reserved(ctx context.Context) *hold {
	h, _ := ctx.Value(reservedKey{}).(*hold)
	if h == nil || h.used {
		return nil
	}
	h.used = true
	return h
}

// takeSlot waits for a free slot and holds it; join makes the hold a
// running cluster's.
func (m machine) takeSlot(ctx context.Context) (*hold, error) {
	h := &hold{m: m, sysctls: map[string]string{}}
	if err := h.waitSlot(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *hold) waitSlot(ctx context.Context) error {
	for {
		for i := range h.m.max {
			p := h.m.path(fmt.Sprintf("slot%d", i))
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				return fmt.Errorf("cluster slot %s: %w", p, err)
			}
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				h.slot, h.slotF = i, f
				return nil
			}
			f.Close()
			if !errors.Is(err, unix.EWOULDBLOCK) {
				return fmt.Errorf("cluster slot %s: %w", p, err)
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("wait for one of %d cluster slots (%s=%d; %d clusters run on this machine): %w",
				h.m.max, ClustersEnv, h.m.max, h.m.max, err)
		}
	}
}

// join joins the running clusters: a shared flock on LockFile, the first
// cluster recording the sysctls, every other reading its record.
func (h *hold) join(ctx context.Context) error {
	for {
		joined, err := h.tryJoin(ctx)
		if joined || err != nil {
			return err
		}
		// An exclusive holder: a cluster of an older harness (one per
		// machine) runs. Wait without the mutex.
		if err := pause(ctx); err != nil {
			return fmt.Errorf("lock %s (a cluster of an older harness runs on this machine): %w", h.m.path("lock"), err)
		}
	}
}

func (h *hold) tryJoin(ctx context.Context) (bool, error) {
	mu, err := h.m.lockMutex(ctx)
	if err != nil {
		return false, err
	}
	defer mu.Close()
	p := h.m.path("lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", p, err)
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		// No cluster runs: the machine's own values.
		if err := h.record(); err != nil {
			f.Close()
			return false, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			f.Close()
			return false, fmt.Errorf("lock %s: %w", p, err)
		}
		h.running = f
		return true, nil
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil {
		if err := h.readRecord(); err != nil {
			f.Close()
			return false, err
		}
		h.running = f
		return true, nil
	}
	f.Close()
	return false, nil
}

// record reads the sysctls and writes them to the record, atomically.
func (h *hold) record() error {
	var b strings.Builder
	for _, s := range h.m.sysctls {
		v, err := os.ReadFile(filepath.Join(h.m.procSys, s))
		if err != nil {
			return fmt.Errorf("record sysctl %s: %w", s, err)
		}
		h.sysctls[s] = strings.TrimSpace(string(v))
		fmt.Fprintf(&b, "%s=%s\n", s, h.sysctls[s])
	}
	p := h.m.path("sysctls")
	if err := os.WriteFile(p+".tmp", []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("record sysctls: %w", err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("record sysctls: %w", err)
	}
	return nil
}

// readRecord reads the first running cluster's record.
func (h *hold) readRecord() error {
	p := h.m.path("sysctls")
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("the sysctls the first running cluster recorded: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			return fmt.Errorf("%s: line %q is not name=value", p, sc.Text())
		}
		h.sysctls[k] = v
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	for _, s := range h.m.sysctls {
		if _, ok := h.sysctls[s]; !ok {
			return fmt.Errorf("%s records no %s", p, s)
		}
	}
	return nil
}

// files are the descriptors the watchdog inherits (fd 3 and 4 of its
// shell): the slot and the shared flock stay held until it exits.
func (h *hold) files() []*os.File { return []*os.File{h.slotF, h.running} }

// release leaves the running clusters and frees the slot; the last one to
// leave restores the recorded sysctls and removes the record. It reports
// whether it restored them. The watchdog (which holds the same flocks) must
// have exited first.
func (h *hold) release(ctx context.Context) (restored bool, err error) {
	defer h.slotF.Close()
	if h.running == nil {
		return false, nil // a slot only: never joined
	}
	mu, err := h.m.lockMutex(ctx)
	if err != nil {
		h.running.Close()
		return false, err
	}
	defer mu.Close()
	p := h.running.Name()
	h.running.Close()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", p, err)
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false, nil // another cluster runs: the last one restores
	}
	var errs []error
	for s, v := range h.sysctls {
		if err := os.WriteFile(filepath.Join(h.m.procSys, s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(h.m.path("sysctls")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return true, errors.Join(errs...)
}

// lockMutex waits for the exclusive flock that orders joining and leaving.
func (m machine) lockMutex(ctx context.Context) (*os.File, error) {
	p := m.path("mutex")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
		if err := pause(ctx); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
	}
}

// pause waits 200 ms, or returns ctx's error.
func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(200 * time.Millisecond):
		return nil
	}
}
