package stepdocker

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
)

// What act v0.261.10 asks for in host mode: a `docker://` step joins the
// job container's network, a Docker action the default one; both get act's
// named volumes and the runner's environment.
func TestRewrite(t *testing.T) {
	rw := rewriter{
		binds:   []string{"/w/7/work", "/w/7/cache"},
		hostEnv: map[string]bool{"HOME=/home/runner": true, "DOCKER_HOST=unix:///run/gdr-docker/docker.sock": true, "GDR_X=1": true},
	}
	actVolumes := []mount.Mount{
		{Type: mount.TypeVolume, Source: "act-toolcache", Target: "/opt/hostedtoolcache"},
		{Type: mount.TypeVolume, Source: "GITEA-ACTIONS-TASK-7_WORKFLOW-ci_JOB-b-env", Target: "/var/run/act"},
		{Type: mount.TypeVolume, Source: "GITEA-ACTIONS-TASK-7_WORKFLOW-ci_JOB-b", Target: "/workspace/alice/repo"},
	}
	for _, tc := range []struct {
		name    string
		network string
		netConf *network.NetworkingConfig
	}{
		{"docker:// step", "container:GITEA-ACTIONS-TASK-7_WORKFLOW-ci_JOB-b", nil},
		{"Docker action", "default", nil},
		{"with endpoints", "bridge", &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{"bridge": {Aliases: []string{"b"}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createRequest{
				Config: &container.Config{
					Image: "probe:1", Hostname: "step",
					Env: []string{"HOME=/home/runner", "PATH=/usr/local/bin:/usr/bin", "GITHUB_OUTPUT=/w/7/cache/ab/act/out",
						"DOCKER_HOST=unix:///run/gdr-docker/docker.sock", "GDR_X=1", "INPUT_WHO=world", "RUNNER_TEMP=/w/7/cache/ab/tmp", "RUNNER_TEMP=/tmp", "HOME=/root"},
				},
				HostConfig: &container.HostConfig{
					NetworkMode: container.NetworkMode(tc.network),
					Binds:       []string{"/run/gdr-docker/docker.sock:/var/run/docker.sock"},
					Mounts:      slices.Clone(actVolumes),
					Privileged:  false,
				},
				NetworkingConfig: tc.netConf,
			}
			rw.rewrite(&req)
			hc := req.HostConfig
			if hc.NetworkMode != "host" || req.NetworkingConfig != nil || req.Hostname != "" {
				t.Errorf("network %q, networking %+v, hostname %q: want the host network, no endpoint, no hostname", hc.NetworkMode, req.NetworkingConfig, req.Hostname)
			}
			if want := []string{"/run/gdr-docker/docker.sock:/var/run/docker.sock", "/w/7/work:/w/7/work", "/w/7/cache:/w/7/cache"}; !slices.Equal(hc.Binds, want) {
				t.Errorf("binds %q, want %q", hc.Binds, want)
			}
			if len(hc.Mounts) != 0 {
				t.Errorf("mounts %+v, want act's named volumes gone", hc.Mounts)
			}
			if want := []string{"GITHUB_OUTPUT=/w/7/cache/ab/act/out", "INPUT_WHO=world", "RUNNER_TEMP=/tmp", "HOME=/root"}; !slices.Equal(req.Env, want) {
				t.Errorf("env %q, want %q", req.Env, want)
			}
		})
	}
	// A bind of the job's own and a non-volume mount stay.
	req := createRequest{Config: &container.Config{}, HostConfig: &container.HostConfig{
		Mounts: []mount.Mount{{Type: mount.TypeTmpfs, Target: "/scratch"}}}}
	rw.rewrite(&req)
	if len(req.HostConfig.Mounts) != 1 {
		t.Errorf("a tmpfs mount was dropped: %+v", req.HostConfig.Mounts)
	}
	// No config at all: the binds and the network still.
	req = createRequest{}
	rw.rewrite(&req)
	if req.HostConfig.NetworkMode != "host" || len(req.HostConfig.Binds) != 2 {
		t.Errorf("an empty creation became %+v", req.HostConfig)
	}
}

// daemon is a stand-in for dockerd on a unix socket: it records container
// creations, answers attach with a protocol switch and echoes the stream.
type daemon struct {
	mu      sync.Mutex
	created []createRequest
	paths   []string
}

func startDaemon(t *testing.T) (host string, d *daemon) {
	t.Helper()
	d = &daemon{}
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/_ping", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Api-Version", "1.43")
		_, _ = io.WriteString(w, "OK")
	})
	mux.HandleFunc("POST /v1.43/containers/create", func(w http.ResponseWriter, r *http.Request) {
		var req createRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.created = append(d.created, req)
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(container.CreateResponse{ID: "c1"})
	})
	mux.HandleFunc("POST /v1.43/containers/c1/attach", func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = conn.Write([]byte("echo " + line))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.paths = append(d.paths, r.Method+" "+r.URL.Path)
		d.mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "[]")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "unix://" + sock, d
}

// Through the proxy, a client's container creation reaches the daemon
// rewritten, other calls pass as they are, an attach switches protocols
// and streams both ways, and an oversized creation is refused.
func TestProxy(t *testing.T) {
	host, d := startDaemon(t)
	found, err := func() (string, error) {
		t.Setenv("DOCKER_HOST", host)
		return Find(context.Background())
	}()
	if err != nil || found != host {
		t.Fatalf("Find() = %q, %v; want %q", found, err, host)
	}
	p, err := Start(found, Options{Binds: []string{"/w/7/work"}, HostEnv: []string{"HOME=/home/runner"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cli, err := client.NewClientWithOpts(client.WithHost(p.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	if _, err := cli.ImageList(ctx, types.ImageListOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.ContainerCreate(ctx, &container.Config{Image: "probe:1", Env: []string{"HOME=/home/runner", "A=1"}},
		&container.HostConfig{NetworkMode: "container:job"}, nil, nil, "step")
	if err != nil || resp.ID != "c1" {
		t.Fatalf("create through the proxy: %+v, %v", resp, err)
	}
	d.mu.Lock()
	created, paths := slices.Clone(d.created), slices.Clone(d.paths)
	d.mu.Unlock()
	if len(created) != 1 || created[0].HostConfig.NetworkMode != "host" || !slices.Equal(created[0].HostConfig.Binds, []string{"/w/7/work:/w/7/work"}) ||
		!slices.Equal(created[0].Env, []string{"A=1"}) || created[0].Image != "probe:1" {
		t.Fatalf("the daemon got %+v", created)
	}
	if !slices.Contains(paths, "GET /v1.43/images/json") {
		t.Errorf("the image listing did not pass: %q", paths)
	}

	hj, err := cli.ContainerAttach(ctx, "c1", types.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true})
	if err != nil {
		t.Fatalf("attach through the proxy: %v", err)
	}
	defer hj.Close()
	if _, err := hj.Conn.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	_ = hj.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(hj.Reader).ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("the attached stream read %q, %v", line, err)
	}

	big := strings.Repeat("x", maxCreateBytes)
	_, err = cli.ContainerCreate(ctx, &container.Config{Image: "probe:1", Env: []string{"BIG=" + big}}, nil, nil, nil, "big")
	if err == nil || !strings.Contains(err.Error(), "step container creation") {
		t.Fatalf("an oversized creation: %v, want refused", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(strings.TrimPrefix(p.Host, "unix://")); !os.IsNotExist(err) {
		t.Errorf("the socket outlived Close: %v", err)
	}
}

func TestFindNoDaemon(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	t.Setenv("DOCKER_HOST", "unix://"+missing)
	if _, err := Find(context.Background()); err == nil || err.Error() != "no Docker daemon: nothing at "+missing {
		t.Fatalf("Find() = %v", err)
	}
	// A socket nobody serves: the ping fails.
	sock := filepath.Join(t.TempDir(), "dead.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := os.WriteFile(sock, nil, 0o600); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	if _, err := Find(context.Background()); err == nil || !strings.Contains(err.Error(), "no Docker daemon answers at unix://"+sock) {
		t.Fatalf("Find() = %v", err)
	}
}
