package function

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// localLike reads GDR_CAPACITY, as local mode does: that old name of
// handle's limit is its own setting now, not a renamed one.
type localLike struct {
	Capacity int `envconfig:"GDR_CAPACITY" default:"2" desc:"a pool's capacity"`
}

func TestRefuseRenamed(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  any
		env  map[string]string
		// want are substrings of the error; none: no error.
		want []string
	}{
		{"nothing set", &testConfig{}, nil, nil},
		{"new names only", &testConfig{}, map[string]string{"GDR_MAX_IN_FLIGHT": "3", "GDR_POLL_INTERVAL": "1s"}, nil},
		{"local sub-prefix", &testConfig{}, map[string]string{"GDR_LOCAL_CAPACITY": "3"},
			[]string{"GDR_LOCAL_CAPACITY is no longer read: it was renamed GDR_CAPACITY"}},
		{"handle's old capacity", &testConfig{}, map[string]string{"GDR_CAPACITY": "3"},
			[]string{"GDR_CAPACITY is no longer read: it was renamed GDR_MAX_IN_FLIGHT", "only local mode's pool capacity"}},
		{"two at once", &testConfig{}, map[string]string{"GDR_INTERVAL": "1s", "GDR_LOCAL_LOG_FORMAT": "json"},
			[]string{"GDR_INTERVAL is no longer read: it was renamed GDR_POLL_INTERVAL", "GDR_LOCAL_LOG_FORMAT is no longer read: it was renamed GDR_LOG_FORMAT"}},
		{"an old name read today", &localLike{}, map[string]string{"GDR_CAPACITY": "3"}, nil},
		{"read today, another refused", &localLike{}, map[string]string{"GDR_CAPACITY": "3", "GDR_LOCAL_CAPACITY": "3"},
			[]string{"GDR_LOCAL_CAPACITY is no longer read: it was renamed GDR_CAPACITY"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range renamedVars() {
				unsetenv(t, r.Old)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := refuseRenamed(tc.cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refuseRenamed() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("refuseRenamed() = nil, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// A function whose environment holds a renamed variable exits 2 before it
// runs, naming the new name; the value is never shown.
func TestExecRefusesRenamed(t *testing.T) {
	for _, r := range renamedVars() {
		unsetenv(t, r.Old)
	}
	t.Setenv("GDR_TEST_KEY", "k")
	const value = "value-never-shown-7"
	t.Setenv("GDR_LOCAL_METRICS_ADDR", value)
	var out bytes.Buffer
	ran := false
	code := Program{Name: "probe"}.Exec(context.Background(), &testConfig{}, nil, &out, func(context.Context, *slog.Logger, []string) error {
		ran = true
		return nil
	})
	if code != ExitConfig || ran {
		t.Fatalf("Exec = %d (ran %v), want %d without running; stderr:\n%s", code, ran, ExitConfig, out.String())
	}
	if !strings.Contains(out.String(), "GDR_LOCAL_METRICS_ADDR is no longer read: it was renamed GDR_METRICS_ADDR") || strings.Contains(out.String(), value) {
		t.Fatalf("stderr does not name the new name, or shows the value:\n%s", out.String())
	}
}

// docs/OPERATIONS.md lists every renamed variable with its new name, and no
// other.
func TestRenamedVarsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n## Renamed settings\n")
	if !ok {
		t.Fatal(`docs/OPERATIONS.md has no "## Renamed settings" section`)
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| `GDR_") {
			rows++
		}
	}
	if rows != len(renamedVars()) {
		t.Errorf("the section has %d rows, renamedVars %d entries", rows, len(renamedVars()))
	}
	for _, r := range renamedVars() {
		if !strings.Contains(section, "| `"+r.Old+"`") || !strings.Contains(section, "| `"+r.New+"` |") {
			t.Errorf("the section lacks the row %s -> %s", r.Old, r.New)
		}
	}
}
