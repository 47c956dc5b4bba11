package function

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

type testConfig struct {
	CommonSettings
	HTTPSettings
	Key   string `envconfig:"GDR_TEST_KEY" required:"true" desc:"a secret"`
	Count int    `envconfig:"GDR_TEST_COUNT" default:"1" desc:"how many"`
	Name  string `envconfig:"GDR_TEST_NAME" default:"env" desc:"a name, also a flag"`
}

func (c *testConfig) Check() error {
	if c.Count < 1 {
		return fmt.Errorf("GDR_TEST_COUNT %d: want at least 1", c.Count)
	}
	return nil
}

func (c *testConfig) Flags(fs *flag.FlagSet) { fs.StringVar(&c.Name, "name", c.Name, "a name") }

func TestExec(t *testing.T) {
	const secret = "s3cr3t-value-never-shown"
	var stdout bytes.Buffer
	p := Program{Name: "probe", Synopsis: "do | dont", Commands: []string{"do", "dont", "maybe"}, Stdout: &stdout}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		run      error
		wantCode int
		wantOut  []string // substrings of stderr
		wantRun  bool
	}{
		{"ok", map[string]string{"GDR_TEST_KEY": secret}, []string{"--name", "flag", "do"}, nil, ExitOK, nil, true},
		{"help", nil, []string{"-h"}, nil, ExitOK, []string{"usage: probe do | dont", "-name", "-version", "GDR_TEST_KEY", "(required)"}, false},
		// --version needs no configuration at all: GDR_TEST_KEY is unset.
		{"version", nil, []string{"--version"}, nil, ExitOK, nil, false},
		{"missing required", nil, []string{"do"}, nil, ExitConfig, []string{"probe: configuration: required variables not set: GDR_TEST_KEY"}, false},
		{"malformed value", map[string]string{"GDR_TEST_KEY": secret, "GDR_TEST_COUNT": secret}, []string{"do"}, nil, ExitConfig, []string{"GDR_TEST_COUNT: not a valid int"}, false},
		{"check fails", map[string]string{"GDR_TEST_KEY": secret, "GDR_TEST_COUNT": "0"}, []string{"do"}, nil, ExitConfig, []string{"GDR_TEST_COUNT 0"}, false},
		{"unknown flag", map[string]string{"GDR_TEST_KEY": secret}, []string{"--nope"}, nil, ExitConfig, []string{"flag provided but not defined"}, false},
		{"usage error", map[string]string{"GDR_TEST_KEY": secret}, []string{"maybe"}, Usage(errors.New(`unknown command "maybe"`)), ExitConfig, []string{`probe: unknown command "maybe"`, "usage: probe do | dont"}, true},
		{"run fails", map[string]string{"GDR_TEST_KEY": secret}, []string{"do"}, errors.New("NATS unreachable"), ExitFailed, []string{`"msg":"probe failed"`, "NATS unreachable", `"function":"probe"`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GDR_TEST_KEY", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if _, ok := tc.env["GDR_TEST_KEY"]; !ok {
				unsetenv(t, "GDR_TEST_KEY")
			}
			var out bytes.Buffer
			stdout.Reset()
			var cfg testConfig
			ran := false
			code := p.Exec(context.Background(), &cfg, tc.args, &out, func(ctx context.Context, log *slog.Logger, args []string) error {
				ran = true
				if tc.name == "ok" && (cfg.Name != "flag" || cfg.Key != secret || len(args) != 1 || args[0] != "do") {
					t.Errorf("run saw config %+v, args %q", cfg, args)
				}
				return tc.run
			})
			if code != tc.wantCode || ran != tc.wantRun {
				t.Fatalf("Exec() = %d (ran %v), want %d (ran %v); stderr:\n%s", code, ran, tc.wantCode, tc.wantRun, out.String())
			}
			for _, want := range tc.wantOut {
				if !strings.Contains(out.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, out.String())
				}
			}
			if strings.Contains(out.String(), secret) {
				t.Errorf("stderr shows a configured value:\n%s", out.String())
			}
			if printed := stdout.String(); (tc.name == "version") != (printed != "") {
				t.Errorf("stdout = %q", printed)
			} else if tc.name == "version" && !strings.HasPrefix(printed, "probe ") {
				t.Errorf("--version printed %q, want it to start with the program name", printed)
			}
		})
	}
}

func TestVersionString(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		want string
	}{
		{Version{Module: "v1.2.3", Commit: "abc123", Time: "2026-12-01T00:00:00Z", Go: "go1.26.0"}, "v1.2.3 commit abc123 2026-12-01T00:00:00Z go1.26.0"},
		{Version{Module: "(devel)", Commit: "abc123", Modified: true, Go: "go1.26.0"}, "(devel) commit abc123 (modified) go1.26.0"},
		{Version{Module: "(devel)", Go: "go1.26.0"}, "(devel) go1.26.0"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.v, got, tc.want)
		}
	}
	// The test binary has build information: its Go version is the
	// toolchain's own.
	if v := BuildVersion(); v.Go != runtime.Version() {
		t.Errorf("BuildVersion().Go = %q, want %q", v.Go, runtime.Version())
	}
}

// A test binary has no VCS record (go test stamps none, as a build with
// -buildvcs=false): the commit is the linker's stamp, "+modified" read as
// Modified.
func TestBuildVersionStamp(t *testing.T) {
	for _, tc := range []struct {
		stamp, commit string
		modified      bool
	}{
		{"", "", false},
		{"0123abcd", "0123abcd", false},
		{"0123abcd+modified", "0123abcd", true},
	} {
		v := buildVersion(tc.stamp)
		if v.Commit != tc.commit || v.Modified != tc.modified || v.Go != runtime.Version() {
			t.Errorf("buildVersion(%q) = %+v, want commit %q, modified %v", tc.stamp, v, tc.commit, tc.modified)
		}
	}
}

// unsetenv removes key for the test (t.Setenv cannot unset).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}

func TestServeShutsDownGracefully(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, Server(h, 1<<10), ln) }()
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("x"))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-started
	cancel() // the request in flight must still be answered
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if code := <-answered; code != http.StatusAccepted {
		t.Fatalf("request in flight answered %d, want 202", code)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve() = %v after a clean shutdown", err)
	}
}

func TestServerCapsBodies(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		fmt.Fprint(w, n)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := Server(h, 1<<10)
	if srv.ReadTimeout == 0 || srv.ReadHeaderTimeout == 0 || srv.IdleTimeout == 0 {
		t.Fatalf("server timeouts unset: %+v", srv)
	}
	go func() { _ = Serve(ctx, srv, ln) }()
	for _, tc := range []struct {
		size int
		want int
	}{{1 << 10, http.StatusOK}, {1<<10 + 1, http.StatusRequestEntityTooLarge}} {
		resp, err := http.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader(strings.Repeat("x", tc.size)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("body of %d bytes: %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

func TestTicksAuthorized(t *testing.T) {
	ran := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++; w.WriteHeader(http.StatusAccepted) })
	for _, tc := range []struct {
		name    string
		token   string
		headers map[string]string
		want    int
	}{
		{"bearer", "t0ken", map[string]string{"Authorization": "Bearer t0ken"}, http.StatusAccepted},
		{"PingSource extension", "t0ken", map[string]string{HeaderTickToken: "t0ken"}, http.StatusAccepted},
		{"no token sent", "t0ken", nil, http.StatusUnauthorized},
		{"wrong token", "t0ken", map[string]string{"Authorization": "Bearer t0ke"}, http.StatusUnauthorized},
		{"wrong scheme", "t0ken", map[string]string{"Authorization": "Basic t0ken"}, http.StatusUnauthorized},
		{"none configured", "", map[string]string{"Authorization": "Bearer "}, http.StatusUnauthorized},
		{"none configured, none sent", "", nil, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ran
			req, _ := http.NewRequest(http.MethodPost, "/", nil)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			TickSettings{TickToken: tc.token}.Authorized(next).ServeHTTP(w, req)
			if w.Code != tc.want || (ran > before) != (tc.want == http.StatusAccepted) {
				t.Fatalf("status %d (ran %v), want %d", w.Code, ran > before, tc.want)
			}
		})
	}
}

// A program with commands refuses any other first argument before it reads
// its configuration: an unknown command is a usage error, never a
// configuration error, even with the configuration missing.
func TestExecCommands(t *testing.T) {
	p := Program{Name: "probe", Synopsis: "do | dont", Commands: []string{"do", "dont"}, Stdout: io.Discard}
	none := Program{Name: "plain", Stdout: io.Discard}
	for _, tc := range []struct {
		name     string
		p        Program
		args     []string
		wantCode int
		wantOut  string
		wantRun  bool
	}{
		{"known command, configuration missing", p, []string{"do"}, ExitConfig, "probe: configuration: required variables not set", false},
		{"unknown command", p, []string{"nope"}, ExitConfig, `probe: unknown command "nope"`, false},
		{"no command", p, nil, ExitConfig, "probe: no command", false},
		{"flags, then an unknown command", p, []string{"--name", "x", "nope"}, ExitConfig, `probe: unknown command "nope"`, false},
		{"help wins", p, []string{"-h", "nope"}, ExitOK, "usage: probe do | dont", false},
		{"version wins", p, []string{"--version", "nope"}, ExitOK, "", false},
		{"no commands: an argument", none, []string{"nope"}, ExitConfig, `plain: unknown command "nope" (plain takes none)`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unsetenv(t, "GDR_TEST_KEY")
			var out bytes.Buffer
			var cfg testConfig
			ran := false
			code := tc.p.Exec(context.Background(), &cfg, tc.args, &out, func(context.Context, *slog.Logger, []string) error {
				ran = true
				return nil
			})
			if code != tc.wantCode || ran != tc.wantRun {
				t.Fatalf("Exec(%q) = %d (ran %v), want %d; stderr:\n%s", tc.args, code, ran, tc.wantCode, out.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantOut, out.String())
			}
			if tc.wantCode == ExitConfig && !strings.Contains(tc.wantOut, "configuration") {
				if strings.Contains(out.String(), "configuration:") {
					t.Errorf("a usage error reads as a configuration error:\n%s", out.String())
				}
				if !strings.Contains(out.String(), "usage: "+tc.p.Name) {
					t.Errorf("no usage after a usage error:\n%s", out.String())
				}
			}
		})
	}
}

// formatConfig chooses its log format, as local mode's --log-format does.
type formatConfig struct{ format string }

func (c *formatConfig) LogFormat() string { return c.format }

func TestExecLogsInTheConfiguredFormat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		textLog bool
		format  string
		isJSON  bool
	}{
		{"json over a text program", true, "json", true},
		{"text over a json program", false, "text", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Program{Name: "probe", TextLog: tc.textLog}
			var out bytes.Buffer
			cfg := formatConfig{format: tc.format}
			code := p.Exec(context.Background(), &cfg, nil, &out, func(_ context.Context, log *slog.Logger, _ []string) error {
				log.Info("hello", slog.Int("n", 1))
				return errors.New("boom")
			})
			if code != ExitFailed {
				t.Fatalf("Exec() = %d", code)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 2 {
				t.Fatalf("want the run's line and the failure's:\n%s", out.String())
			}
			for _, line := range lines {
				var obj map[string]any
				if err := json.Unmarshal([]byte(line), &obj); (err == nil) != tc.isJSON {
					t.Errorf("line %q parses as JSON: %v, want %v", line, err == nil, tc.isJSON)
				}
			}
		})
	}
}
