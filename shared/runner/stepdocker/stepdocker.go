// Package stepdocker gives act, in host mode, the Docker daemon of the
// executor for the containers it starts for steps: a `uses: docker://` step
// and a Docker action (`runs.using: docker`).
//
// act's host mode starts those containers as it would beside a job container
// that host mode never starts: a `docker://` step joins the network of that
// missing container (`container:<job>`), a Docker action the daemon's default
// network (a bridge, which a rootless daemon outside a user namespace cannot
// give); neither gets the job's workspace nor act's files (GITHUB_OUTPUT,
// GITHUB_ENV, the event), which in host mode are paths on the host, but named
// volumes that are empty; both inherit the runner's own environment, PATH
// included. A Proxy stands between act's Docker client and the daemon and
// rewrites each container creation into what the step would get beside a job
// container: the job's network (the daemon's host network: in the executor
// Pod RootlessKit's namespace, whose traffic leaves as the Pod's; in local mode
// the machine's), the folders holding the workspace and act's files bound at
// their own paths (the daemon sees them there: the docker capability mounts
// the runner's work folder in the daemon at the same path), and the step's
// environment without the runner's. Every other call passes unchanged.
//
// The job's own steps use the daemon directly (DOCKER_HOST): the proxy is
// act's alone.
package stepdocker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"golang.org/x/net/netutil"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/writeprogress"
)

// Proxy bounds: a request's headers; a container creation's body (JSON, read
// whole to be rewritten; other bodies, a build context, stream); an idle
// connection; each write of a response (an attached container's output is a
// hijacked stream, not bounded); the connections held at once.
const (
	headerTimeout  = 10 * time.Second
	maxCreateBytes = 1 << 20
	idleTimeout    = time.Minute
	writeProgress  = 30 * time.Second
	maxConnections = 64
)

// pingTimeout bounds Find's question to the daemon.
const pingTimeout = 10 * time.Second

// Find returns the address of the Docker daemon the environment names
// (DOCKER_HOST; unset, Docker's default socket), once it answers a ping; or
// an error that says what was asked and, for the job log, that nothing
// answered. A runner calls it once, before the job: a pool with the docker
// capability holds the runner back until its daemon answers.
func Find(ctx context.Context) (string, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv)
	if err != nil {
		return "", fmt.Errorf("the Docker client's settings (DOCKER_HOST %q): %w", os.Getenv("DOCKER_HOST"), err)
	}
	defer cli.Close()
	host := cli.DaemonHost()
	// Docker's client keeps a unix socket's path as the URL's host.
	if u, err := client.ParseHostURL(host); err == nil && u.Scheme == "unix" {
		if _, err := os.Stat(u.Host); err != nil {
			return "", fmt.Errorf("no Docker daemon: nothing at %s", u.Host)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		return "", fmt.Errorf("no Docker daemon answers at %s: %w", host, err)
	}
	return host, nil
}

// Options shape the containers a Proxy creates.
type Options struct {
	// Binds are host folders bound into every step container at their own
	// path, read-write: the task's folder, holding the workspace and act's
	// files.
	Binds []string
	// HostEnv is the runner's own environment (os.Environ()): a step
	// container gets none of those entries, nor PATH (the image's applies),
	// but the step's own variables.
	HostEnv []string
}

// Proxy is the daemon act talks to (its DOCKER_HOST), on a unix socket in a
// folder of its own (0700).
type Proxy struct {
	// Host is the proxy's address for DOCKER_HOST: unix://<socket>.
	Host string

	srv *http.Server
	dir string
}

// createPath is the Docker API's container creation, with or without a
// version prefix.
var createPath = regexp.MustCompile(`^(/v[0-9.]+)?/containers/create$`)

// Start serves a Proxy to the daemon at daemonHost (Find's answer) until
// Close.
func Start(daemonHost string, opt Options) (*Proxy, error) {
	cli, err := client.NewClientWithOpts(client.WithHost(daemonHost), client.WithTLSClientConfigFromEnv())
	if err != nil {
		return nil, fmt.Errorf("step containers: the daemon %s: %w", daemonHost, err)
	}
	target := &url.URL{Scheme: "http", Host: "docker"}
	if u, err := client.ParseHostURL(daemonHost); err == nil && u.Scheme == "tcp" {
		target.Host = u.Host
		if os.Getenv("DOCKER_TLS_VERIFY") != "" || os.Getenv("DOCKER_CERT_PATH") != "" {
			target.Scheme = "https"
		}
	}
	dir, err := os.MkdirTemp("", "gdr-stepdocker-")
	if err != nil {
		return nil, fmt.Errorf("step containers: %w", err)
	}
	sock := filepath.Join(dir, "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("step containers: %w", err)
	}
	rw := rewriter{binds: opt.Binds, hostEnv: map[string]bool{}}
	for _, kv := range opt.HostEnv {
		rw.hostEnv[kv] = true
	}
	rp := &httputil.ReverseProxy{
		Transport: cli.HTTPClient().Transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.Host = target.Host
		},
		// A container's logs and a build's progress stream as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Errorf("the Docker daemon %s: %w", daemonHost, err))
		},
	}
	mux := http.NewServeMux()
	mux.Handle("/", rp)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && createPath.MatchString(r.URL.Path) {
			if err := rw.request(w, r); err != nil {
				writeError(w, http.StatusBadRequest, err)
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
	p := &Proxy{Host: "unix://" + sock, dir: dir}
	p.srv = &http.Server{
		Handler:           writeprogress.Handler(handler, writeProgress),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	go func() { _ = p.srv.Serve(netutil.LimitListener(ln, maxConnections)) }()
	return p, nil
}

// Close stops the proxy and removes its socket.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	return errors.Join(err, os.RemoveAll(p.dir))
}

// writeError answers as the daemon does: {"message": ...}.
func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": err.Error()})
}

// createRequest is the body of a container creation, as Docker's client
// sends it.
type createRequest struct {
	*container.Config
	HostConfig       *container.HostConfig     `json:",omitempty"`
	NetworkingConfig *network.NetworkingConfig `json:",omitempty"`
}

type rewriter struct {
	binds   []string
	hostEnv map[string]bool
}

// request replaces r's body, a container creation, by its rewrite.
func (rw rewriter) request(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCreateBytes))
	if err != nil {
		return fmt.Errorf("step container creation: %w", err)
	}
	var req createRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("step container creation: %w", err)
	}
	rw.rewrite(&req)
	out, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("step container creation: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	r.Header.Set("Content-Length", strconv.Itoa(len(out)))
	return nil
}

// rewrite makes act's step container one beside the job: the job's
// network (the daemon's host network), the task's folders bound at their own
// paths instead of act's named volumes, and the step's environment without
// the runner's.
func (rw rewriter) rewrite(req *createRequest) {
	if req.Config == nil {
		req.Config = &container.Config{}
	}
	if req.HostConfig == nil {
		req.HostConfig = &container.HostConfig{}
	}
	hc := req.HostConfig
	hc.NetworkMode = "host"
	req.NetworkingConfig = nil
	// Host networking: no port of the container is published, and it takes
	// no name of its own on the network.
	hc.PortBindings, hc.PublishAllPorts = nil, false
	req.ExposedPorts = nil
	req.Hostname, req.Domainname = "", ""
	hc.Mounts = slices.DeleteFunc(hc.Mounts, func(m mount.Mount) bool { return m.Type == mount.TypeVolume })
	for _, b := range rw.binds {
		hc.Binds = append(hc.Binds, b+":"+b)
	}
	req.Env = rw.env(req.Env)
}

// env keeps of a container's environment what the step set: the last value of
// each name, none of the runner's own entries, no PATH.
func (rw rewriter) env(in []string) []string {
	last := map[string]int{}
	for i, kv := range in {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	var out []string
	for i, kv := range in {
		k, _, _ := strings.Cut(kv, "=")
		if last[k] != i || k == "PATH" || rw.hostEnv[kv] {
			continue
		}
		out = append(out, kv)
	}
	return out
}
