package clusterenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeMachine is a machine whose lock files and "sysctls" are files of
// t.TempDir(), each sysctl "0" before any cluster.
func fakeMachine(t *testing.T, slots int) machine {
	t.Helper()
	m := machine{dir: t.TempDir(), procSys: t.TempDir(), sysctls: []string{"vm/overcommit_memory", "kernel/panic"}, max: slots}
	for _, s := range m.sysctls {
		setSysctl(t, m, s, "0")
	}
	return m
}

func setSysctl(t *testing.T, m machine, name, v string) {
	t.Helper()
	p := filepath.Join(m.procSys, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func sysctlsOf(t *testing.T, m machine) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range m.sysctls {
		b, err := os.ReadFile(filepath.Join(m.procSys, s))
		if err != nil {
			t.Fatal(err)
		}
		out[s] = strings.TrimSpace(string(b))
	}
	return out
}

// kubeletSets is what a kubelet does to the sysctls once its cluster runs.
func kubeletSets(t *testing.T, m machine) {
	t.Helper()
	for _, s := range m.sysctls {
		setSysctl(t, m, s, "1")
	}
}

func holdOrFatal(t *testing.T, m machine) *hold {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := m.takeSlot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.join(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

func assertSysctls(t *testing.T, m machine, want string) {
	t.Helper()
	for s, v := range sysctlsOf(t, m) {
		if v != want {
			t.Errorf("sysctl %s = %s, want %s", s, v, want)
		}
	}
}

// Two clusters overlap: the second reads the first's record (not the
// values the first's kubelet set), the first to stop restores nothing, the
// last restores the machine's own values.
func TestMachineLastRestores(t *testing.T) {
	m := fakeMachine(t, 2)
	a := holdOrFatal(t, m)
	kubeletSets(t, m)
	b := holdOrFatal(t, m)
	if a.slot == b.slot {
		t.Fatalf("two clusters share slot %d", a.slot)
	}
	for s, v := range b.sysctls {
		if v != "0" {
			t.Errorf("the second cluster took %s=%s for the machine's value, want the first's record 0", s, v)
		}
	}
	restored, err := a.release(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if restored {
		t.Fatal("the first to stop restored the sysctls while another cluster runs")
	}
	assertSysctls(t, m, "1")
	restored, err = b.release(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !restored {
		t.Fatal("the last to stop did not restore the sysctls")
	}
	assertSysctls(t, m, "0")
	if _, err := os.Stat(m.path("sysctls")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record outlived the last cluster: %v", err)
	}
	// Alone again: a new first cluster records the machine afresh.
	setSysctl(t, m, m.sysctls[0], "7")
	c := holdOrFatal(t, m)
	if got := c.sysctls[m.sysctls[0]]; got != "7" {
		t.Errorf("a new first cluster recorded %s, want 7", got)
	}
	if _, err := c.release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// With every slot taken, a cluster waits, and its error names the setting;
// a stopped cluster frees its slot.
func TestMachineSlotsBound(t *testing.T) {
	m := fakeMachine(t, 1)
	a := holdOrFatal(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, err := m.takeSlot(ctx); err == nil || !strings.Contains(err.Error(), ClustersEnv) {
		t.Fatalf("hold with the only slot taken: %v, want an error naming %s", err, ClustersEnv)
	}
	if _, err := a.release(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := holdOrFatal(t, m)
	if b.slot != 0 {
		t.Errorf("slot %d, want 0", b.slot)
	}
	if _, err := b.release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The watchdog of a test binary that died without Stop keeps the slot until
// it is done, and restores the sysctls only as the last cluster.
func TestWatchdogTakesLastTurn(t *testing.T) {
	for _, tc := range []struct {
		name         string
		otherRunning bool
		want         string // the sysctls after the watchdog
	}{
		{"alone", false, "0"},
		{"another cluster runs", true, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fakeMachine(t, 2)
			h := holdOrFatal(t, m)
			kubeletSets(t, m)
			var other *hold
			if tc.otherRunning {
				other = holdOrFatal(t, m)
			}
			d, err := watch(h, t.TempDir(), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The test binary dies: its descriptors close, the pipe ends
			// without a line.
			h.slotF.Close()
			h.running.Close()
			d.w.Close()
			if err := d.cmd.Wait(); err != nil {
				t.Fatalf("watchdog: %v", err)
			}
			assertSysctls(t, m, tc.want)
			// Its slot is free again.
			next := holdOrFatal(t, m)
			if next.slot != h.slot {
				t.Errorf("next cluster got slot %d, want the dead one's %d", next.slot, h.slot)
			}
			if _, err := next.release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if other != nil {
				if restored, err := other.release(context.Background()); err != nil || !restored {
					t.Fatalf("the last cluster: restored %v, %v", restored, err)
				}
				assertSysctls(t, m, "0")
			}
		})
	}
}

// Reserve holds a slot from before the test's own timeout until a cluster
// takes it, once.
func TestReserveHoldsASlotForOneCluster(t *testing.T) {
	m := fakeMachine(t, 1)
	ctx := m.reserve(context.Background(), t)
	short, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	if _, err := m.takeSlot(short); err == nil {
		t.Fatal("another cluster took the reserved slot")
	}
	h := reserved(ctx)
	if h == nil {
		t.Fatal("no reserved hold in the context")
	}
	if reserved(ctx) != nil {
		t.Fatal("a second cluster got the same reserved hold")
	}
	if err := h.join(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.release(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := holdOrFatal(t, m)
	if _, err := next.release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
