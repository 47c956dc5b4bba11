package jobservices

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePorts(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []Port
		err  string
	}{
		{in: nil},
		{in: []string{"5432", "6379/tcp", "8080:8080", " 9000:9000/tcp ", "5432"}, want: []Port{5432, 6379, 8080, 9000}},
		{in: []string{"8080:80"}, err: "under another number"},
		{in: []string{"127.0.0.1:80:80"}, err: "host IP"},
		{in: []string{"53/udp"}, err: "only TCP"},
		{in: []string{"8000-8010"}, err: "no ranges"},
		{in: []string{"0"}, err: "want a port number"},
		{in: []string{"65536"}, err: "want a port number"},
		{in: []string{"http"}, err: "want a port number"},
	} {
		got, err := ParsePorts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePorts(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestExpandPortExpressions(t *testing.T) {
	services := []Service{{ID: "postgres", Ports: []string{"5432:5432"}}, {ID: "redis", Ports: []string{"6379"}}}
	for _, tc := range []struct{ in, want string }{
		{`run: psql -p ${{ job.services.postgres.ports['5432'] }}`, `run: psql -p ${{ 5432 }}`},
		{`run: 'echo ${{ job.services.redis.ports[''6379''] }}'`, `run: 'echo ${{ 6379 }}'`},
		{`if: job.services.Redis.ports[6379] == '6379'`, `if: 6379 == '6379'`},
		{`x: ${{ job.services.postgres.ports[ '5432' ] }}`, `x: ${{ 5432 }}`},
		// Not declared: left for act, which gives nothing, as before.
		{`x: ${{ job.services.postgres.ports['5433'] }}`, `x: ${{ job.services.postgres.ports['5433'] }}`},
		{`x: ${{ job.services.mysql.ports['3306'] }}`, `x: ${{ job.services.mysql.ports['3306'] }}`},
		{`x: ${{ job.services.postgres.id }}`, `x: ${{ job.services.postgres.id }}`},
	} {
		if got := string(ExpandPortExpressions([]byte(tc.in), services)); got != tc.want {
			t.Errorf("ExpandPortExpressions(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 nothing listens on (just
// closed).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

func TestWaitReadyListenerOpensLate(t *testing.T) {
	late, early := freePort(t), 0
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	early = l.Addr().(*net.TCPAddr).Port
	opened := make(chan net.Listener, 1)
	time.AfterFunc(700*time.Millisecond, func() {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(late))
		if err != nil {
			t.Error(err)
		}
		opened <- l
	})
	services := []Service{{ID: "a", Ports: []string{strconv.Itoa(early)}}, {ID: "b", Ports: []string{strconv.Itoa(late) + "/tcp"}}}
	var waited []string
	start := time.Now()
	err = WaitReady(context.Background(), services, 10*time.Second, func(s string, p Port) {
		waited = append(waited, s+":"+strconv.Itoa(int(p)))
	})
	if l := <-opened; l != nil {
		defer l.Close()
	}
	if err != nil {
		t.Fatalf("WaitReady = %v", err)
	}
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("WaitReady returned after %v, before the late listener opened", d)
	}
	if want := []string{"a:" + strconv.Itoa(early), "b:" + strconv.Itoa(late)}; !reflect.DeepEqual(waited, want) {
		t.Fatalf("waited for %v, want %v", waited, want)
	}
}

func TestWaitReadyNeverOpens(t *testing.T) {
	port := freePort(t)
	start := time.Now()
	err := WaitReady(context.Background(), []Service{{ID: "postgres", Ports: []string{strconv.Itoa(port)}}}, 800*time.Millisecond, nil)
	var nr *NotReadyError
	if !errors.As(err, &nr) || nr.Service != "postgres" || nr.Port != Port(port) {
		t.Fatalf("WaitReady = %v; want a NotReadyError for postgres:%d", err, port)
	}
	for _, want := range []string{"service postgres", "port " + strconv.Itoa(port), "800ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if d := time.Since(start); d < 800*time.Millisecond || d > 3*time.Second {
		t.Fatalf("WaitReady gave up after %v, want about 800ms", d)
	}
}

func TestWaitReadyCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := WaitReady(ctx, []Service{{ID: "db", Ports: []string{strconv.Itoa(freePort(t))}}}, time.Minute, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady = %v, want the context's error", err)
	}
	if err := WaitReady(context.Background(), []Service{{ID: "db", Ports: []string{"1:2"}}}, time.Second, nil); err == nil || !strings.Contains(err.Error(), "service db") {
		t.Fatalf("bad port: %v", err)
	}
}
