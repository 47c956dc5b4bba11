//go:build e2e

package pod

import (
	"encoding/json"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hardenedTemplate is a pool template that meets Pod Security's restricted
// level by itself (as the shipped one does).
const hardenedTemplate = `{"podTemplate":{"spec":{
  "automountServiceAccountToken":false,"enableServiceLinks":false,
  "securityContext":{"runAsNonRoot":true,"runAsUser":65532,"runAsGroup":65532,"fsGroup":65532,"seccompProfile":{"type":"RuntimeDefault"}},
  "containers":[{"name":"runner","image":"gdr-runner-host:v1",
    "securityContext":{"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,"capabilities":{"drop":["ALL"]}},
    "volumeMounts":[{"name":"tmp","mountPath":"/tmp"}]}],
  "volumes":[{"name":"tmp","emptyDir":{}}]}}}`

// withProfile returns a profile with extra top-level fields (JSON members,
// no braces) before hardenedTemplate's.
func withProfile(fields string) string {
	if fields == "" {
		return hardenedTemplate
	}
	return "{" + fields + "," + hardenedTemplate[1:]
}

// TestE2EInjection creates, on the real API server, the Pods of a plain job
// and of a `container:` job, with the CSI driver (in a namespace that
// enforces Pod Security's restricted level, which the injected init
// container and volumes must pass) and with a hostPath socket (which
// restricted forbids: it is accepted in a namespace without enforcement), and
// checks the injected runner, volumes and variable as the server stored them.
func TestE2EInjection(t *testing.T) {
	env := newEnv(t)
	ctx := ctxT(t)
	restricted := newEnv(t)
	rns, err := restricted.client.CoreV1().Namespaces().Get(ctx, restricted.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rns.Labels == nil {
		rns.Labels = map[string]string{}
	}
	rns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := restricted.client.CoreV1().Namespaces().Update(ctx, rns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		env       e2eEnv
		profile   string
		taskID    int64
		jobImage  string
		want      injected
		forbidden string // a substring of the server's Forbidden message, if the Pod must be refused
	}{
		{
			name: "plain job, CSI, restricted", env: restricted, profile: withProfile(`"runnerImage":"gdr-runner:v1"`), taskID: 1,
			want: injected{runnerImage: "gdr-runner-host:v1", initImage: "gdr-runner:v1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 65532, gid: 65532},
		},
		{
			name: "container job, CSI, restricted", env: restricted, profile: withProfile(`"runnerImage":"gdr-runner:v1"`), taskID: 2,
			jobImage: "node:22-bookworm",
			want:     injected{runnerImage: "node:22-bookworm", initImage: "gdr-runner:v1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 65532, gid: 65532},
		},
		{
			name: "container job, default runner image", env: env, profile: testTemplate, taskID: 3, jobImage: "alpine:3",
			want: injected{runnerImage: "alpine:3", initImage: "runner:v1", env: wantSocket, csiDriver: "csi.spiffe.io", uid: 65532, gid: 65532},
		},
		{
			name: "container job, hostPath", env: env, profile: withProfile(`"workloadAPI":{"hostPath":"/run/spire/agent-sockets"}`),
			taskID: 4, jobImage: "golang:1.26",
			want: injected{runnerImage: "golang:1.26", initImage: "gdr-runner-host:v1", env: wantSocket,
				hostPath: "/run/spire/agent-sockets", uid: 65532, gid: 65532},
		},
		{
			name: "hostPath, restricted", env: restricted, profile: withProfile(`"workloadAPI":{"hostPath":"/run/spire/agent-sockets"}`),
			taskID: 5, forbidden: "hostPath",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.env.config(nil)
			cfg.Pools[0].Profile = json.RawMessage(tc.profile)
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a := testAssignment(t, tc.taskID, tc.jobImage)
			_, err = b.Create(ctx, a, launch(tc.env.keys, a))
			if tc.forbidden != "" {
				if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.forbidden) {
					t.Fatalf("Create = %v; want the server's Forbidden naming %s", err, tc.forbidden)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			pod, err := tc.env.client.CoreV1().Pods(tc.env.ns).Get(ctx, b.PodName(a.ID), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range checkInjected(pod, tc.want) {
				t.Error(p)
			}
			// The environment stays in the Secret, read by the runner
			// container alone.
			c := pod.Spec.Containers[0]
			if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != SecretName(pod.Name) {
				t.Errorf("runner envFrom %+v", c.EnvFrom)
			}
			raw, _ := json.Marshal(pod)
			if strings.Contains(string(raw), secretValue) {
				t.Fatal("the Pod object holds a credential")
			}
		})
	}
}
