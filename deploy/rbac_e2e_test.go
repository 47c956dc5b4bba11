//go:build e2e

package deploy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/kubeenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// memoryEntries is a SPIRE Entry API in memory: the RBAC test is about Kubernetes calls only.
type memoryEntries struct {
	mu      sync.Mutex
	entries map[string]*spiretypes.Entry
}

func (m *memoryEntries) BatchCreateEntry(_ context.Context, in *entryv1.BatchCreateEntryRequest, _ ...grpc.CallOption) (*entryv1.BatchCreateEntryResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &entryv1.BatchCreateEntryResponse{}
	for _, e := range in.GetEntries() {
		if got, ok := m.entries[e.GetId()]; ok {
			out.Results = append(out.Results, &entryv1.BatchCreateEntryResponse_Result{
				Status: &spiretypes.Status{Code: int32(codes.AlreadyExists)}, Entry: got})
			continue
		}
		m.entries[e.GetId()] = e
		out.Results = append(out.Results, &entryv1.BatchCreateEntryResponse_Result{Status: &spiretypes.Status{}, Entry: e})
	}
	return out, nil
}

func (m *memoryEntries) GetEntry(_ context.Context, in *entryv1.GetEntryRequest, _ ...grpc.CallOption) (*spiretypes.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[in.GetId()]; ok {
		return e, nil
	}
	return nil, status.Error(codes.NotFound, "no such entry")
}

func (m *memoryEntries) BatchDeleteEntry(_ context.Context, in *entryv1.BatchDeleteEntryRequest, _ ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &entryv1.BatchDeleteEntryResponse{}
	for _, id := range in.GetIds() {
		code := codes.OK
		if _, ok := m.entries[id]; !ok {
			code = codes.NotFound
		}
		delete(m.entries, id)
		out.Results = append(out.Results, &entryv1.BatchDeleteEntryResponse_Result{Id: id, Status: &spiretypes.Status{Code: int32(code)}})
	}
	return out, nil
}

// giteaTasks is Gitea's view of the tasks for recover: which are over, and the reports.
type giteaTasks struct {
	mu       sync.Mutex
	terminal map[int64]bool
	reports  map[int64]executor.Phase
}

func (g *giteaTasks) Terminal(_ context.Context, id int64) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.terminal[id], nil
}

func (g *giteaTasks) Report(_ context.Context, id int64, e executor.Executor) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reports[id], g.terminal[id] = e.Phase, true
	return nil
}

func (g *giteaTasks) cancel(id int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.terminal[id] = true
}

// buildInNamespace builds the kustomization dir with its namespace set to ns.
func buildInNamespace(t *testing.T, dir, ns string) []doc {
	t.Helper()
	root := copyDeploy(t)
	override(t, filepath.Join(root, dir), ns, "", "")
	return buildKustomization(t, filepath.Join(root, dir))
}

// buildInNamespaces builds the kustomization dir with the control plane in ns and the executors
// in jobs, and the components enabled.
func buildInNamespaces(t *testing.T, dir, ns, jobs string, components ...string) []doc {
	t.Helper()
	root := copyDeploy(t)
	override(t, filepath.Join(root, dir), ns, "", "")
	setExecutorsNamespace(t, filepath.Join(root, dir), jobs)
	for _, c := range components {
		enableComponent(t, filepath.Join(root, dir), c)
	}
	return buildKustomization(t, filepath.Join(root, dir))
}

// applyRBAC creates the RBAC objects as the cluster admin, each in the namespace the build gave
// it, and deletes the cluster-scoped ones when the test ends (the namespaces take the others).
func applyRBAC(ctx context.Context, t *testing.T, admin kubernetes.Interface, objs rbacObjects) {
	t.Helper()
	create := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	for _, o := range objs.accounts {
		_, err := admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		create("ServiceAccount "+o.Name, err)
	}
	for _, o := range objs.roles {
		_, err := admin.RbacV1().Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		create("Role "+o.Name, err)
	}
	for _, o := range objs.roleBindings {
		_, err := admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		create("RoleBinding "+o.Name, err)
	}
	for _, o := range objs.clusterRoles {
		_, err := admin.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		create("ClusterRole "+o.Name, err)
		t.Cleanup(func() { _ = admin.RbacV1().ClusterRoles().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
	}
	for _, o := range objs.clusterRoleBindings {
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
		create("ClusterRoleBinding "+o.Name, err)
		t.Cleanup(func() {
			_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
		})
	}
}

// serviceAccountOf returns the serviceAccountName of the Pod template of the workload kind/name.
func serviceAccountOf(t *testing.T, docs []doc, kind, name string) string {
	t.Helper()
	d := one(t, docs, kind, name)
	tmpl, _ := path(d.obj, podTemplatePaths[kind]...).(map[string]any)
	sa, _ := path(tmpl, "spec", "serviceAccountName").(string)
	if sa == "" {
		t.Fatalf("%s: no serviceAccountName", d)
	}
	return sa
}

func serviceAccountUser(ns, name string) string { return "system:serviceaccount:" + ns + ":" + name }

// impersonating returns a client that acts as the ServiceAccount ns/name (the admin impersonates
// it: the API server authorizes every call as that ServiceAccount, and audits both).
func impersonating(t *testing.T, p *kubeenv.Plane, ns, name string) kubernetes.Interface {
	t.Helper()
	cfg := p.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceAccountUser(ns, name)}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// auditEvent is the part of an audit.k8s.io/v1 Event the test reads.
type auditEvent struct {
	Verb             string `json:"verb"`
	RequestURI       string `json:"requestURI"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// readAudit reads the audit log once the event of a request for the ConfigMap marker is in it:
// every call made before that request is then logged too.
func readAudit(ctx context.Context, t *testing.T, p *kubeenv.Plane, admin kubernetes.Interface, ns string) []auditEvent {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	marker := "audit-flush-" + hex.EncodeToString(b[:])
	if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, marker, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get ConfigMap %s: %v", marker, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		events := parseAudit(t, p.AuditLog())
		for _, e := range events {
			if e.ObjectRef != nil && e.ObjectRef.Name == marker {
				return events
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log %s has no event for %s after 30 s", p.AuditLog(), marker)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func parseAudit(t *testing.T, file string) []auditEvent {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a line being written
		}
		out = append(out, e)
	}
	return out
}

// usedBy returns what the user's calls used, by namespace and cluster-wide, and the calls the
// API server refused as forbidden.
func usedBy(events []auditEvent, user string) (namespaced map[string]map[permission]bool, cluster map[permission]bool, forbidden []string) {
	namespaced, cluster = map[string]map[permission]bool{}, map[permission]bool{}
	for _, e := range events {
		if e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user {
			continue
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			forbidden = append(forbidden, e.Verb+" "+e.RequestURI)
		}
		if e.ObjectRef == nil {
			forbidden = append(forbidden, "non-resource "+e.Verb+" "+e.RequestURI)
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		p := permission{e.ObjectRef.APIGroup, res, e.Verb}
		if ns := e.ObjectRef.Namespace; ns == "" {
			cluster[p] = true
		} else {
			if namespaced[ns] == nil {
				namespaced[ns] = map[permission]bool{}
			}
			namespaced[ns][p] = true
		}
	}
	return namespaced, cluster, forbidden
}

// TestE2ERBAC applies the shipped RBAC (keda built by kustomize: the control plane in a fresh
// namespace, the executors in another), once as shipped (executors get minted SVIDs) and once
// with the workload-api component, to a real API server and runs the pod backend, in the
// executors' namespace, as handle's and as recover's ServiceAccount, through
// every path their code takes: handle's Accept (create; with workload-api wait for scheduling
// and register the entry under the Node; complete a Pod whose Secret is stale), recover's pass (a corrupt Pod's Event; a succeeded, a failed and a
// stuck executor reported and deleted; a missing executor re-created; a stale Secret repaired; a
// cancelled task's executor deleted). A verb missing from a Role fails a step (403); the audit
// log then shows that every call was allowed and that each ServiceAccount used every verb it is
// granted, and nothing else, namespace by namespace: nothing at all in the control plane's,
// where neither holds any grant (its Secrets are out of their reach).
func TestE2ERBAC(t *testing.T) {
	for _, mode := range []string{backend.PodIdentityMinted, backend.PodIdentityWorkloadAPI} {
		t.Run(mode, func(t *testing.T) { testRBAC(t, mode) })
	}
}

// testRBAC is TestE2ERBAC in one GDR_POD_IDENTITY mode, as its install builds it.
func testRBAC(t *testing.T, mode string) {
	p := plane.Plane(t)
	if p.AuditLog() == "" {
		t.Fatal("the control plane runs without an audit log")
	}
	controlNS, ns := p.Namespace(t), p.Namespace(t) // ns: the executors'
	admin := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var components []string
	if mode == backend.PodIdentityWorkloadAPI {
		components = append(components, "workload-api")
	}
	built := buildInNamespaces(t, "keda", controlNS, ns, components...)
	objs := rbacDocs(t, built)
	applyRBAC(ctx, t, admin, objs)
	handleSA := serviceAccountOf(t, built, "ScaledJob", "handle-pod")
	recoverSA := serviceAccountOf(t, built, "CronJob", "recover")

	cfg := shippedPodConfig(t, built)
	keys, td := cfg.Keys, cfg.TrustDomain
	minted := mode == backend.PodIdentityMinted
	if (cfg.Minter != nil) != minted {
		t.Fatalf("the build's gdr-config mints executor SVIDs: %v; want %v in mode %s", cfg.Minter != nil, minted, mode)
	}
	entries := &memoryEntries{entries: map[string]*spiretypes.Entry{}}
	backend := func(client kubernetes.Interface, now func() time.Time) *pod.Backend {
		c := cfg
		c.Client, c.Namespace, c.Entries, c.Now = client, ns, entries, now
		c.CorruptEvents = true // as functions/recover and handle configure it (shared/backend)
		b, err := pod.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if cfgNS := stringMap(path(one(t, built, "ConfigMap", "gdr-config").obj, "data"))["GDR_KUBE_NAMESPACE"]; cfgNS != ns {
		t.Fatalf("gdr-config: GDR_KUBE_NAMESPACE %q, want the executors' namespace %q", cfgNS, ns)
	}
	handleBackend := backend(impersonating(t, p, controlNS, handleSA), time.Now)
	// recover's clock runs an hour ahead, so that a Pod waiting on an image is stuck at once.
	recoverBackend := backend(impersonating(t, p, controlNS, recoverSA), func() time.Time { return time.Now().Add(time.Hour) })
	boot, err := bootstrap.New(secretkey.Key(strings.Repeat("k", bootstrap.MinKeyLength)), "https://gateway:443",
		spiffeid.RequireFromPath(td, "/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	gitea := &giteaTasks{terminal: map[int64]bool{}, reports: map[int64]executor.Phase{}}
	handle := executor.Worker{Backend: handleBackend, Bootstrap: boot, Keys: keys}
	recoverW := executor.Worker{Backend: recoverBackend, Tasks: gitea, Bootstrap: boot, Keys: keys}

	assignment := func(task int64) taskassignment.Assignment {
		id, err := taskidentity.New(td, "owner/repo", "build", task)
		if err != nil {
			t.Fatal(err)
		}
		a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: task, Pool: "linux"}, id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	pods := admin.CoreV1().Pods(ns)
	secrets := admin.CoreV1().Secrets(ns)
	node := ns + "-node"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	schedule := func(a taskassignment.Assignment) { // what the scheduler does
		t.Helper()
		err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: handleBackend.PodName(a.ID)},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("bind the Pod of %s: %v", a.ID, err)
		}
	}
	setStatus := func(a taskassignment.Assignment, phase corev1.PodPhase, waiting string) { // what the kubelet does
		t.Helper()
		p, err := pods.Get(ctx, handleBackend.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		if waiting != "" {
			for _, c := range p.Spec.Containers {
				p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
					Name: c.Name, Image: c.Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: waiting}}})
			}
		}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("set the status of the Pod of %s: %v", a.ID, err)
		}
	}
	// staleSecret makes the Secret of a's Pod look like an earlier Pod's (a crash, a re-created
	// Pod): the backend must rewrite it.
	staleSecret := func(a taskassignment.Assignment) {
		t.Helper()
		s, err := secrets.Get(ctx, pod.SecretName(handleBackend.PodName(a.ID)), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.OwnerReferences[0].UID = "00000000-0000-0000-0000-000000000000"
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ownedByItsPod := func(a taskassignment.Assignment) bool {
		t.Helper()
		p, err := pods.Get(ctx, handleBackend.PodName(a.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := secrets.Get(ctx, pod.SecretName(p.Name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(s.OwnerReferences) == 1 && s.OwnerReferences[0].UID == p.UID
	}
	accept := func(a taskassignment.Assignment, want bool) {
		t.Helper()
		if ok, err := handle.Accept(ctx, a); err != nil || ok != want {
			t.Fatalf("handle: Accept(%s) = %v, %v; want %v", a.ID, ok, err, want)
		}
	}

	// handle: three executors created and bound; minted at once (the SVID is in the Secret),
	// with workload-api once the scheduler has placed the Pod (its entry's parent is the
	// Node's agent).
	running := []taskassignment.Assignment{assignment(1), assignment(2), assignment(3)}
	for _, a := range running {
		accept(a, minted)
		schedule(a)
		if !minted {
			accept(a, true)
		}
	}
	// handle: a redelivery finds a Pod whose Secret an earlier Pod owned: Create completes it.
	stale := assignment(4)
	accept(stale, minted)
	staleSecret(stale)
	accept(stale, minted)
	if !ownedByItsPod(stale) {
		t.Fatal("handle did not repair the stale Secret")
	}
	if s, err := secrets.Get(ctx, pod.SecretName(handleBackend.PodName(stale.ID)), metav1.GetOptions{}); err != nil || (len(s.Data["CI_SVID_CERT"]) > 0) != minted {
		t.Fatalf("the Secret of %s holds an SVID: %v (err %v); want %v", stale.ID, err == nil && len(s.Data["CI_SVID_CERT"]) > 0, err, minted)
	}

	// recover: a Pod of this installation whose metadata does not rebuild gets an Event.
	corrupt := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gdr-corrupt", Labels: keys.RunnerSelector()},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runner", Image: "runner:v1"}}},
	}
	if _, err := pods.Create(ctx, corrupt, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setStatus(running[0], corev1.PodSucceeded, "")
	setStatus(running[1], corev1.PodFailed, "")
	setStatus(running[2], corev1.PodPending, "ImagePullBackOff")
	// `recover status`: why a pending Pod waits (a Pod get).
	if why, err := recoverBackend.WaitReason(ctx, running[2].ID); err != nil || !strings.Contains(why, "ImagePullBackOff") {
		t.Fatalf("recover: WaitReason = %q, %v; want kubelet's ImagePullBackOff", why, err)
	}
	found, err := recoverBackend.RecoverAssignments(ctx)
	if err != nil {
		t.Fatalf("recover: RecoverAssignments: %v", err)
	}
	var ids []string
	for _, a := range found {
		ids = append(ids, a.ID)
		if _, err := recoverW.Finish(ctx, a); err != nil {
			t.Fatalf("recover: Handle(%s): %v", a.ID, err)
		}
	}
	slices.Sort(ids)
	if want := []string{"linux-1", "linux-2", "linux-3", "linux-4"}; !slices.Equal(ids, want) {
		t.Fatalf("recover found %v, want %v", ids, want)
	}
	for task, want := range map[int64]executor.Phase{1: executor.PhaseSucceeded, 2: executor.PhaseFailed, 3: executor.PhaseFailed} {
		if got := gitea.reports[task]; got != want {
			t.Errorf("recover reported task %d as %q, want %q", task, got, want)
		}
	}
	evs, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
		return e.Reason == "CorruptExecutorMetadata" && e.InvolvedObject.Name == corrupt.Name
	}) {
		t.Error("recover wrote no Event on the corrupt Pod (events create is best effort: a 403 is only in the audit log)")
	}
	// recover: an executor that is missing is not created (only handle creates executors, from
	// a queue message; the payload is then an orphan the recover pass re-publishes); a
	// cancelled task's executor is deleted.
	missing := assignment(5)
	if done, err := recoverW.Finish(ctx, missing); err != nil || done {
		t.Fatalf("recover: Handle of a missing executor = %v, %v", done, err)
	}
	if _, err := pods.Get(ctx, handleBackend.PodName(missing.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("recover created the missing executor: %v", err)
	}
	gitea.cancel(stale.Task.ID)
	if done, err := recoverW.Finish(ctx, stale); err != nil || !done {
		t.Fatalf("recover: Handle of a cancelled task = %v, %v", done, err)
	}
	if _, err := pods.Get(ctx, handleBackend.PodName(stale.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the executor of the cancelled task: %v", err)
	}

	events := readAudit(ctx, t, p, admin, ns)
	for _, sa := range []string{handleSA, recoverSA} {
		t.Run(sa, func(t *testing.T) {
			usedNS, usedCluster, forbidden := usedBy(events, serviceAccountUser(controlNS, sa))
			if len(usedNS[ns])+len(usedCluster) == 0 {
				t.Fatal("no call in the audit log")
			}
			if len(forbidden) > 0 {
				t.Errorf("calls the API server refused (a verb missing from the shipped RBAC):\n  %s", strings.Join(forbidden, "\n  "))
			}
			grantedNS, grantedCluster, problems := objs.granted(controlNS, sa)
			if len(problems) > 0 {
				t.Errorf("grants: %s", strings.Join(problems, "; "))
			}
			if len(grantedNS[controlNS]) > 0 {
				t.Errorf("granted in the control plane's namespace %s: %v", controlNS, keysOf(grantedNS[controlNS]))
			}
			for _, n := range slices.Sorted(maps.Keys(grantedNS)) {
				if u := unusedGrants(grantedNS[n], usedNS[n]); len(u) > 0 {
					t.Errorf("granted in namespace %s, never used by any path: %v", n, u)
				}
			}
			for _, n := range slices.Sorted(maps.Keys(usedNS)) {
				if u := unusedGrants(usedNS[n], grantedNS[n]); len(u) > 0 {
					t.Errorf("used in namespace %s without a grant: %v", n, u)
				}
			}
			if u := unusedGrants(grantedCluster, usedCluster); len(u) > 0 {
				t.Errorf("granted cluster-wide, never used by any path: %v", u)
			}
			if u := unusedGrants(usedCluster, grantedCluster); len(u) > 0 {
				t.Errorf("used cluster-wide without a grant: %v", u)
			}
			t.Logf("%s used: namespace %s %v, cluster %v", sa, ns, keysOf(usedNS[ns]), keysOf(usedCluster))
		})
	}
}
