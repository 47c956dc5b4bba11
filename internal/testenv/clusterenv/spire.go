package clusterenv

import (
	"archive/tar"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	imagespec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/spireenv"
)

// SPIRECluster is the cluster name of the k8s_psat node attestor: the
// server must be started with spireenv.WithK8sPSAT(SPIRECluster,
// c.AdminKubeconfig()).
const SPIRECluster = "gdr"

// SPIREAgentSocketDir is the node's folder of the SPIRE agent's Workload API
// socket (spire-agent.sock), for hostPath volumes: the documented alternative
// to the SPIFFE CSI driver, whose module the Go module proxy refuses here.
// It is inside the node's private /run.
const SPIREAgentSocketDir = "/run/spire/agent-sockets"

// AdminKubeconfig is the path of a cluster-admin kubeconfig for programs on
// the machine (the API server at 127.0.0.1).
func (c *Cluster) AdminKubeconfig() string { return filepath.Join(c.Dir, "admin.kubeconfig") }

// StartSPIREAgent runs spire-agent v1.13.3 on every node as SPIRE's
// Kubernetes install does (its DaemonSet's Pods, here one Pod per node bound
// by nodeName: spire-agent on the first node, spire-agent-<node name> on the
// others): in namespace spire as ServiceAccount spire-agent (get pods and
// nodes, cluster-wide), host network and host PID namespace (the k8s
// workload attestor asks its node's kubelet at 127.0.0.1:10250 and reads
// callers' cgroups), its socket in SPIREAgentSocketDir of its node by
// hostPath, attesting to server with k8s_psat (a projected token, audience
// spire-server) through Forward, bootstrapped with the server's bundle. It
// returns the agents' SPIFFE IDs, in the order of NodeNames, once the server
// lists every agent: each the parent of entries for Pods on its node (the
// pod backend's agentID).
//
// syncInterval, when not zero, is the agent's experimental sync_interval:
// how often it asks the server for new entries (SPIRE's default and most is
// 5 s), which bounds how long a new executor waits for its SVID.
func (c *Cluster) StartSPIREAgent(ctx context.Context, t testing.TB, server *spireenv.Server, syncInterval time.Duration) []spiffeid.ID {
	t.Helper()
	experimental := ""
	if syncInterval > 0 {
		experimental = fmt.Sprintf("\n    experimental {\n        sync_interval = %q\n    }", syncInterval.String())
	}
	img, err := binaryImage(t, spireenv.AgentBinary(t), "spire-agent")
	if err == nil {
		err = c.ImportImage(ctx, img, "gdr.local/spire-agent")
	}
	if err != nil {
		t.Fatalf("clusterenv: spire-agent image: %v", err)
	}
	addr, err := c.Forward(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	cs := c.Client(t)
	const ns, sa = "spire", "spire-agent"
	conf := fmt.Sprintf(`agent {
    data_dir = "/run/spire/agent-data"
    log_level = "DEBUG"
    server_address = %q
    server_port = %q
    socket_path = %q
    trust_domain = %q
    trust_bundle_path = "/etc/spire/bundle.crt"%s
}
plugins {
    NodeAttestor "k8s_psat" {
        plugin_data {
            cluster = %q
            token_path = "/var/run/secrets/tokens/spire-agent"
        }
    }
    KeyManager "memory" {
        plugin_data {}
    }
    WorkloadAttestor "k8s" {
        plugin_data {
            skip_kubelet_verification = true
        }
    }
}
`, host, port, SPIREAgentSocketDir+"/spire-agent.sock", spireenv.TrustDomain, experimental, SPIRECluster)
	expiry := int64(3600)
	objects := []func() error{
		func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: sa},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "nodes/proxy"}, Verbs: []string{"get"}}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: sa},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: sa},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: sa},
				Data:       map[string]string{"agent.conf": conf, "bundle.crt": string(server.Bundle(t))},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objects {
		if err := create(); err != nil {
			t.Fatalf("clusterenv: SPIRE agent objects: %v", err)
		}
	}
	c.WaitServiceAccount(ctx, t, ns)
	var ids []spiffeid.ID
	names := map[string]string{} // agent ID path -> its Pod
	for _, n := range c.nodes {
		name := sa
		if n.index > 0 {
			name = sa + "-" + n.name
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, agentPod(name, n.name, expiry), metav1.CreateOptions{}); err != nil {
			t.Fatalf("clusterenv: SPIRE agent Pod on %s: %v", n.name, err)
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		id, err := spiffeid.FromSegments(server.TrustDomain, "spire", "agent", "k8s_psat", SPIRECluster, string(node.UID))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		names[id.Path()] = name
	}
	agents := agentv1.NewAgentClient(server.Conn())
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := agents.ListAgents(ctx, &agentv1.ListAgentsRequest{})
		missing := map[string]string{}
		for path, name := range names {
			missing[path] = name
		}
		if err == nil {
			for _, a := range resp.GetAgents() {
				delete(missing, a.GetId().GetPath())
			}
			if len(missing) == 0 {
				return ids
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.DumpLogs(t)
			for path, name := range missing {
				t.Logf("SPIRE agent %s (Pod %s) log:\n%s", path, name, c.podLog(ctx, ns, name))
			}
			t.Fatalf("clusterenv: SPIRE agents did not attest (last error %v): %d of %d missing", err, len(missing), len(names))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// agentPod is a SPIRE agent Pod named name, bound to the node node.
func agentPod(name, node string, expiry int64) *corev1.Pod {
	const sa = "spire-agent"
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	root := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": sa}},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: sa, HostNetwork: true, HostPID: true, DNSPolicy: corev1.DNSClusterFirstWithHostNet,
			RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{
				Name: sa, Image: "gdr.local/spire-agent:latest", ImagePullPolicy: corev1.PullNever,
				Args:            []string{"run", "-config", "/etc/spire/agent.conf"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: &root}, // creates the socket folder on the node
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: "/etc/spire", ReadOnly: true},
					{Name: "sockets", MountPath: SPIREAgentSocketDir},
					{Name: "data", MountPath: "/run/spire/agent-data"},
					{Name: "token", MountPath: "/var/run/secrets/tokens", ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: sa}}}},
				{Name: "sockets", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: SPIREAgentSocketDir, Type: &dirOrCreate}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
					ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: sa, Audience: "spire-server", ExpirationSeconds: &expiry},
				}}}}},
			},
		},
	}
}

// podLog is the log of a Pod's first container, or why it could not be read.
func (c *Cluster) podLog(ctx context.Context, ns, name string) string {
	cs, err := c.clientset()
	if err != nil {
		return err.Error()
	}
	b, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		p, _ := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if p != nil {
			return fmt.Sprintf("no log (%v); status %+v", err, p.Status)
		}
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// binaryImage writes an OCI layout (linux/amd64) holding the static binary
// at bin as /<name>, its entrypoint, into a temporary folder, and returns the
// layout's folder.
func binaryImage(t testing.TB, bin, name string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	tarPath := filepath.Join(t.TempDir(), name+".tar")
	if err := writeTar(tarPath, name, data); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromFile(tarPath)
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/" + name}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	out := filepath.Join(t.TempDir(), name)
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return "", err
	}
	// The ref name is the tag `ctr images import --base-name` gives it.
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		layout.WithAnnotations(map[string]string{imagespec.AnnotationRefName: "latest"})); err != nil {
		return "", err
	}
	return out, nil
}

// writeTar writes a tar archive at path with one executable file, name.
func writeTar(path, name string, data []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func (c *Cluster) clientset() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(c.Plane.RESTConfig())
}
