// Package batchsandboxenv runs OpenSandbox's Kubernetes runtime, the
// BatchSandbox controller manager built from the pinned OpenSandbox source
// (commit 4db3a993), against a test cluster (clusterenv), so that a
// BatchSandbox is acted on as in a cluster where OpenSandbox's lifecycle
// server uses `[runtime] type = "kubernetes"` with provider `batchsandbox`.
//
// The manager, its CRDs, execd, bootstrap.sh and a static busybox are built
// and copied once, outside the checkout, by `make peers`
// (scripts/peers/opensandbox-k8s.sh build). Assets finds them; Start installs
// the CRDs and starts the manager as a child process of the test binary;
// ImportImages builds the node's images from the same folder and imports
// them into the node's containerd.
//
// What a test can rely on:
//   - The manager's metrics (plain HTTP) and health probes are on free ports
//     of 127.0.0.1; it runs without leader election and without webhooks,
//     as cluster-admin (the cluster's admin kubeconfig), and watches every
//     namespace. Its log is in a temporary folder.
//   - Start returns once the manager's readiness probe answers; a controller
//     may take a moment longer to pick up an object.
//   - The manager is stopped when the test ends, and also if the test binary
//     dies first (Linux: the parent-death signal; see testenv.Process). Its
//     log is printed when the test failed.
//   - No registry exists: every image a sandbox Pod names must be one
//     ImportImages imported, under a tag other than "latest" (the API server
//     defaults the pull policy of a ":latest" image it is not told about,
//     such as the provider's execd-installer init container, to Always,
//     which would ask a registry).
package batchsandboxenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	imagespec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kedaenv"
)

// Commit is the OpenSandbox commit the harness is written against and
// scripts/peers/opensandbox-k8s.sh builds; it is also the tag of the images
// ImportImages imports.
const Commit = "4db3a993"

// The images ImportImages imports into the node (linux/amd64 only).
const (
	// ExecdImage is the lifecycle server's `execd_image`: the image of the
	// provider's execd-installer init container, which runs
	// `/bin/sh -c "cp ./execd ... && cp ./bootstrap.sh ..."` in its working
	// folder. Like upstream's image it holds /execd and /bootstrap.sh,
	// works in /, and has execd as entrypoint; busybox is its shell.
	ExecdImage = "gdr.local/opensandbox-execd:" + Commit
	// SandboxImage is a user's image: a busybox root, enough for
	// bootstrap.sh (a /bin/sh script) and a shell command as entrypoint.
	SandboxImage = "gdr.local/opensandbox-sandbox:" + Commit
)

// Assets returns the folder of scripts/peers/opensandbox-k8s.sh's build
// (${GDR_PEERS:-$HOME/.cache/gitea-dynamic-runner}/opensandbox-k8s-4db3a993,
// or $GDR_OPENSANDBOX_K8S_DIR). If it is missing the test is skipped, except
// with CI=true, where it fails (testenv.RequirePeer).
func Assets(t testing.TB) string {
	t.Helper()
	return testenv.RequirePeer(t, testenv.Peer{
		Name: "opensandbox-k8s", Version: Commit,
		Executables: []string{"manager", "execd", "bootstrap.sh", "busybox"},
		Folders:     []string{"crds"},
	})
}

// Manager is one running OpenSandbox controller manager.
type Manager struct {
	// MetricsAddr and ProbeAddr are the host:port of its Prometheus metrics
	// (plain HTTP) and its health probes (/healthz, /readyz), on 127.0.0.1.
	MetricsAddr, ProbeAddr string

	proc    *testenv.Process
	logPath string
}

// PID is the manager's process ID.
func (m *Manager) PID() int { return m.proc.PID() }

// Exited is closed once the manager has exited.
func (m *Manager) Exited() <-chan struct{} { return m.proc.Exited() }

// LogTail returns the last n lines of the manager's log (stdout and stderr).
func (m *Manager) LogTail(n int) string { return testenv.LogTail(m.logPath, n) }

// Log returns the manager's whole log so far.
func (m *Manager) Log() string {
	b, _ := os.ReadFile(m.logPath)
	return string(b)
}

// Start installs OpenSandbox's CRDs (BatchSandbox, Pool, SandboxSnapshot)
// into c's API server, waiting until they are Established, and starts the
// manager with c's admin kubeconfig. It fails the test if any step fails or
// the manager is not ready within ctx. The manager is stopped when the test
// ends.
func Start(ctx context.Context, t testing.TB, c *clusterenv.Cluster) *Manager {
	t.Helper()
	dir := Assets(t)
	if err := kedaenv.InstallCRDs(ctx, c.Plane.RESTConfig(), filepath.Join(dir, "crds")); err != nil {
		t.Fatalf("batchsandboxenv: %v", err)
	}
	work := t.TempDir()
	loopback := func() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t))) }
	m := &Manager{MetricsAddr: loopback(), ProbeAddr: loopback(), logPath: filepath.Join(work, "manager.log")}
	logf, err := os.Create(m.logPath)
	if err != nil {
		t.Fatalf("batchsandboxenv: %v", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(filepath.Join(dir, "manager"),
		"--metrics-bind-address="+m.MetricsAddr,
		"--metrics-secure=false",
		"--health-probe-bind-address="+m.ProbeAddr,
		"--leader-elect=false",
		"--zap-log-level=info",
	)
	cmd.Dir = work
	// Its whole environment: nothing of the test's (proxies, credentials)
	// leaks in. No POD_NAMESPACE: the manager then watches no ConfigMap of
	// pool-assignment profiles (pool mode only).
	cmd.Env = []string{"HOME=" + work, "KUBECONFIG=" + c.AdminKubeconfig()}
	cmd.Stdout, cmd.Stderr = logf, logf
	m.proc, err = testenv.StartProcess(cmd)
	if err != nil {
		t.Fatalf("batchsandboxenv: %v", err)
	}
	t.Cleanup(func() {
		m.proc.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("batchsandboxenv: tail of the manager's log %s:\n%s", m.logPath, m.LogTail(80))
		}
	})
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute) // two cores shared with compilers
	defer cancel()
	if err := m.proc.WaitReady(readyCtx, 200*time.Millisecond, m.ready); err != nil {
		t.Fatalf("batchsandboxenv: manager: %v", err) // the cleanup prints its log
	}
	return m
}

// ready asks the manager's readiness probe.
func (m *Manager) ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.ProbeAddr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return nil
}

// ImportImages builds ExecdImage and SandboxImage from the peer's folder and
// imports them into c's node.
func ImportImages(ctx context.Context, t testing.TB, c *clusterenv.Cluster) {
	t.Helper()
	dir := Assets(t)
	base, err := busyboxLayer(ctx, filepath.Join(dir, "busybox"))
	if err != nil {
		t.Fatalf("batchsandboxenv: %v", err)
	}
	execd, err := filesLayer(map[string]string{"execd": filepath.Join(dir, "execd"), "bootstrap.sh": filepath.Join(dir, "bootstrap.sh")})
	if err != nil {
		t.Fatalf("batchsandboxenv: %v", err)
	}
	for _, im := range []struct {
		ref        string
		layers     []v1.Layer
		entrypoint []string
	}{
		{SandboxImage, []v1.Layer{base}, []string{"/bin/sh"}},
		{ExecdImage, []v1.Layer{base, execd}, []string{"/execd"}},
	} {
		repo, tag, _ := strings.Cut(im.ref, ":")
		out := filepath.Join(t.TempDir(), filepath.Base(repo))
		if err := writeLayout(out, tag, im.layers, im.entrypoint); err != nil {
			t.Fatalf("batchsandboxenv: image %s: %v", im.ref, err)
		}
		if err := c.ImportImage(ctx, out, repo); err != nil {
			t.Fatalf("batchsandboxenv: %v", err)
		}
	}
}

// busyboxLayer is a root of busybox at bin (static): /bin/busybox with a
// symbolic link in /bin for each of its applets, /etc/passwd and /etc/group
// naming root, and /tmp and /root.
func busyboxLayer(ctx context.Context, bin string) (v1.Layer, error) {
	list, err := exec.CommandContext(ctx, bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", bin, err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return layer(func(tw *tar.Writer) error {
		for _, d := range []struct {
			name string
			mode int64
		}{{"bin", 0o755}, {"etc", 0o755}, {"root", 0o700}, {"tmp", 0o1777}} {
			if err := tw.WriteHeader(&tar.Header{Name: d.name + "/", Mode: d.mode, Typeflag: tar.TypeDir}); err != nil {
				return err
			}
		}
		if err := writeFile(tw, "bin/busybox", 0o755, data); err != nil {
			return err
		}
		for _, applet := range strings.Fields(string(list)) {
			if applet == "busybox" || strings.Contains(applet, "/") {
				continue
			}
			if err := tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Linkname: "busybox", Typeflag: tar.TypeSymlink, Mode: 0o777}); err != nil {
				return err
			}
		}
		if err := writeFile(tw, "etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n")); err != nil {
			return err
		}
		return writeFile(tw, "etc/group", 0o644, []byte("root:x:0:\n"))
	})
}

// filesLayer is a layer with each file of files (name in / -> path on the
// machine), mode 0755.
func filesLayer(files map[string]string) (v1.Layer, error) {
	return layer(func(tw *tar.Writer) error {
		for name, path := range files {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if err := writeFile(tw, name, 0o755, data); err != nil {
				return err
			}
		}
		return nil
	})
}

func writeFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// layer is an uncompressed layer holding what fill writes.
func layer(fill func(*tar.Writer) error) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := fill(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// writeLayout writes an OCI layout at out holding one linux/amd64 image of
// layers, working in / with PATH set and entrypoint, under ref name tag
// (`ctr images import --base-name REPO` names it REPO:tag).
func writeLayout(out, tag string, layers []v1.Layer, entrypoint []string) error {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = entrypoint
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		layout.WithAnnotations(map[string]string{imagespec.AnnotationRefName: tag}))
}
