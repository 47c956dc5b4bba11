//go:build !race

package taskrun

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func servicesWorkflow(port int, step string) string {
	p := strconv.Itoa(port)
	return "on: push\njobs:\n  test:\n    runs-on: x\n    services:\n      db:\n        image: postgres:17\n        ports: ['" + p + ":" + p + "']\n" +
		"      cache:\n        image: redis:7\n    steps:\n      - run: " + step + "\n"
}

func TestPrepareServices(t *testing.T) {
	wf := servicesWorkflow(5432, "true")
	for _, tc := range []struct {
		name string
		host Host
		wf   string
		want string // "" when it must prepare
	}{
		{"executor runs them", Host{Services: []string{"cache", "db"}}, wf, ""},
		{"executor runs none (process, opensandbox)", Host{}, wf, "only the pod backend runs services"},
		{"executor runs others", Host{Services: []string{"db"}}, wf, "its executor runs [db]"},
		{"remapped port", Host{Services: []string{"db"}},
			"on: push\njobs:\n  t:\n    runs-on: x\n    services:\n      db:\n        image: p\n        ports: ['15432:5432']\n    steps:\n      - run: true\n", "service db: port"},
	} {
		job, err := Prepare(task(t, tc.wf, nil), tc.host)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: Prepare() = %v", tc.name, err)
			} else if len(job.job.Services) != 0 || len(job.services) != 2 {
				t.Errorf("%s: act still sees %d services; the runner waits for %d", tc.name, len(job.job.Services), len(job.services))
			}
			continue
		}
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Prepare() = %v, want an UnsupportedError mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestRunWaitsForServices: the first step runs once the service's port,
// opened late, accepts connections, and reads the port from
// job.services.<id>.ports.
func TestRunWaitsForServices(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	opened := time.Now().Add(time.Second)
	time.AfterFunc(time.Second, func() {
		late, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { _ = late.Close() })
	})
	tk := task(t, servicesWorkflow(port, `echo "db=${{ job.services.db.ports['`+strconv.Itoa(port)+`'] }} at $(date +%s%N)"`), nil)
	job, err := Prepare(tk, Host{Services: []string{"cache", "db"}, ServiceTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder(context.Background())
	dir := t.TempDir()
	if err := job.Run(context.Background(), r, Options{WorkDir: dir + "/work", CacheDir: dir + "/cache"}); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(r.rows, "\n")
	i := strings.Index(all, "db="+strconv.Itoa(port)+" at ")
	if i < 0 || r.job != "success" {
		t.Fatalf("job %q, log:\n%s", r.job, all)
	}
	ns, _ := strconv.ParseInt(strings.Fields(all[i:])[2], 10, 64)
	if ran := time.Unix(0, ns); ran.Before(opened) {
		t.Fatalf("the step ran at %v, before the service's port opened at %v", ran, opened)
	}
}

// TestRunFailsWhenAServiceNeverListens: no step runs, and the error (the
// job's last words) names the service and port.
func TestRunFailsWhenAServiceNeverListens(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	job, err := Prepare(task(t, servicesWorkflow(port, "echo ran-anyway"), nil), Host{Services: []string{"cache", "db"}, ServiceTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder(context.Background())
	dir := t.TempDir()
	start := time.Now()
	err = job.Run(context.Background(), r, Options{WorkDir: dir + "/work", CacheDir: dir + "/cache"})
	if err == nil || !strings.Contains(err.Error(), "service db: port "+strconv.Itoa(port)) {
		t.Fatalf("Run = %v; want the reason naming service db and its port", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v, want about the 1s timeout", d)
	}
	if strings.Contains(strings.Join(r.rows, "\n"), "ran-anyway") {
		t.Fatal("a step ran although the service never became ready")
	}
}
