//go:build e2e

package opensandbox_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/batchsandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/clusterenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/opensandboxenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/reporter"
)

const (
	// k8sJobsNamespace is where the server creates the jobs' BatchSandboxes.
	k8sJobsNamespace = "opensandbox-jobs"
	// k8sJobImage is runner-host as the node holds it: a tag other than
	// latest, so nothing ever asks a registry.
	k8sJobImage = "gdr.local/gitea-dynamic-runner-runner-host:e2e"
)

var k8sBatchSandboxes = schema.GroupVersionResource{Group: "sandbox.opensandbox.io", Version: "v1alpha1", Resource: "batchsandboxes"}

// kubernetesJobsRuntime starts a cluster with OpenSandbox's BatchSandbox
// controller, the execd and job images, and the lifecycle server of the
// Kubernetes runtime. Sandboxes (Pods) reach the machine's servers through
// Cluster.Forward at the node's address; Gitea's ROOT_URL is there.
func kubernetesJobsRuntime(ctx context.Context, t *testing.T) jobsRuntime {
	t.Helper()
	images := imagesDir(t)
	batchsandboxenv.Assets(t) // skip (or fail, CI=true) before a cluster starts
	testenv.RequirePeer(t, opensandboxenv.Peer)
	c := clusterenv.Start(ctx, t)
	batchsandboxenv.ImportImages(ctx, t, c)
	layout := retagLayout(t, filepath.Join(images, "runner-host"), "e2e")
	repo, _, _ := strings.Cut(k8sJobImage, ":")
	if err := c.ImportImage(ctx, layout, repo); err != nil {
		t.Fatal(err)
	}
	batchsandboxenv.Start(ctx, t, c)
	s := batchsandboxenv.StartServer(ctx, t, c, k8sJobsNamespace)
	kube := c.Client(t)
	dyn, err := dynamic.NewForConfig(c.Plane.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return jobsRuntime{
		s: s, image: k8sJobImage,
		// Requests too (the provider sets both): two sandboxes beside the
		// cluster's own Pods on two cores.
		limits: map[string]string{"cpu": "500m", "memory": "1Gi"},
		gitea: func(t *testing.T) *giteaenv.Server {
			port := testenv.FreePort(t)
			if _, err := c.Forward(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
				t.Fatal(err)
			}
			return giteaenv.Start(t, giteaenv.Options{ChannelQueue: true, Port: port, RootHost: c.NodeIP()})
		},
		reach: c.Forward,
		leftovers: func(ctx context.Context) ([]string, error) {
			var left []string
			bss, err := dyn.Resource(k8sBatchSandboxes).Namespace(k8sJobsNamespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list BatchSandboxes: %w", err)
			}
			for _, bs := range bss.Items {
				left = append(left, "BatchSandbox "+bs.GetName())
			}
			pods, err := kube.CoreV1().Pods(k8sJobsNamespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list Pods: %w", err)
			}
			for _, p := range pods.Items {
				left = append(left, fmt.Sprintf("Pod %s (%s)", p.Name, podState(p)))
			}
			return left, nil
		},
	}
}

func podState(p corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return string(p.Status.Phase) + ", deleting"
	}
	return string(p.Status.Phase)
}

// retagLayout copies the OCI layout at src into
// a temporary folder, naming its image tag instead of what src names it,
// and returns the copy.
func retagLayout(t *testing.T, src, tag string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		if rel == "index.json" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			const from = `"org.opencontainers.image.ref.name": "latest"`
			if !strings.Contains(string(b), from) {
				return fmt.Errorf("%s names no image latest", p)
			}
			return os.WriteFile(out, []byte(strings.ReplaceAll(string(b), from, `"org.opencontainers.image.ref.name": "`+tag+`"`)), 0o644)
		}
		return copyFile(p, out) // never a link: src may be another checkout's

	})
	if err != nil {
		t.Fatalf("retag the layout %s: %v", src, err)
	}
	return dst
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestE2EOpenSandboxKubernetesJobs runs real Gitea jobs in OpenSandbox
// sandboxes of the Kubernetes runtime (BatchSandboxes on a real cluster,
// the runner-host image), in the world of TestE2EOpenSandboxDockerJobs:
// a successful job (checkout, step outputs, a masked secret) ends
// `success` and its sandbox is deleted; a job cancelled in Gitea has its
// sandbox gone within 30 s; a job whose sandbox is removed (as at its
// expiry) ends and gets no second sandbox; then nothing is left (no
// sandbox, BatchSandbox, Pod or payload).
func TestE2EOpenSandboxKubernetesJobs(t *testing.T) {
	// Its timeout starts once a cluster slot is its (clusterenv.Reserve).
	ctx, cancel := context.WithTimeout(clusterenv.Reserve(context.Background(), t), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	w := newJobsWorld(ctx, t, kubernetesJobsRuntime(ctx, t))
	t.Logf("world up in %v", time.Since(begin).Round(time.Second))
	t.Run("Jobs", func(t *testing.T) {
		t.Run("Success", func(t *testing.T) {
			t.Parallel()
			w.success(ctx, t)
		})
		t.Run("Cancel", func(t *testing.T) {
			t.Parallel()
			w.cancelled(ctx, t)
		})
		t.Run("Removed", func(t *testing.T) {
			t.Parallel()
			w.removedKubernetes(ctx, t)
		})
	})
	t.Run("NothingLeft", func(t *testing.T) {
		w.nothingLeft(ctx, t)
	})
	t.Logf("all cases in %v", time.Since(begin).Round(time.Second))
}

// removedKubernetes: the sandbox of a running job is removed (DELETE, as
// the server removes one at its expiry). Unlike Docker's (vanished), the
// Pod is not killed at once: the garbage collector deletes it with the
// default grace period, so the runner gets SIGTERM and may report the job
// itself before recover sees the executor gone. Either way the job ends
// within a minute, failed or cancelled (logged as observed), and no second
// sandbox is made: the job never runs again.
func (w *jobsWorld) removedKubernetes(ctx context.Context, t *testing.T) {
	repo := w.gitea.CreateRepo(t, "removed")
	w.gitea.PushWorkflow(t, repo, ".gitea/workflows/ci.yml",
		"name: ci\non: [push]\njobs:\n  removed:\n    runs-on: "+jobsLabel+"\n    steps:\n      - run: sleep 600\n")
	a := w.assignment(t, "removed", 60*time.Second)
	sb := w.sandbox(ctx, t, a, 60*time.Second)
	w.waitStepRunning(t, a, 90*time.Second)
	if err := w.api.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.api.Get(ctx, sb.ID); !sandboxapi.IsNotFound(err) {
		t.Fatalf("sandbox %s after its removal: %v, want 404", sb.ID, err)
	}
	removed := time.Now()
	j := w.waitJob(t, repo, "removed", completed, 60*time.Second)
	logs := w.gitea.JobLogs(t, repo, j.ID)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	t.Logf("observed: removed sandbox: job %s %v after the removal; the log's last line: %s", j.Conclusion,
		time.Since(removed).Round(100*time.Millisecond), lines[len(lines)-1])
	switch last := lines[len(lines)-1]; {
	case j.Conclusion == "cancelled" && strings.Contains(last, reporter.StoppedWords): // the runner's SIGTERM
	case j.Conclusion == "failure" && strings.Contains(last, "its executor vanished"): // recover first
	default:
		t.Fatalf("job = %+v, last line %q: want cancelled saying the runner was stopped, or failed as vanished", j, last)
	}
	// Several recover passes later, still no sandbox of the assignment.
	time.Sleep(6 * time.Second)
	if got, err := w.api.List(ctx, sandboxapi.ListFilter{Metadata: map[string]string{w.keys.AssignmentID: a.ID}}); err != nil || len(got) != 0 {
		t.Fatalf("sandboxes of assignment %s after its removal: %+v, %v: want none (the job must not run again)", a.ID, got, err)
	}
}
