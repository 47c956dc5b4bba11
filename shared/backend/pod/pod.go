// Package pod runs each assignment in its own Kubernetes Pod and binds
// the Pod's SPIFFE identity through a SPIRE registration entry. It implements
// executor.Backend.
//
// Everything the backend knows it reads back from Kubernetes and SPIRE; it
// stores nothing itself. For an assignment with ID <id>:
//
//   - the Pod is <NamePrefix><id> in the configured namespace (deterministic,
//     so a second Create meets AlreadyExists and returns the same Pod), built
//     from the pool's pod template, labelled and annotated with the metadata
//     contract (taskassignment.Keys), restartPolicy Never,
//     activeDeadlineSeconds = the pool's job timeout;
//   - the runner is injected, so the runner container may run any image (the
//     job's `container:`): an init container copies the static runner from
//     the pool's runner image into an emptyDir, and the runner container
//     runs RunnerPath from it, with the SPIRE agent's Workload API (the
//     SPIFFE CSI driver's volume, or a hostPath) read-only at WorkloadAPIDir
//     and SPIFFE_ENDPOINT_SOCKET naming its socket (see ParseProfile);
//   - the job's `services:` (from the signed assignment) are native sidecars
//     after the install init container, their keys resolve to 127.0.0.1
//     (hostAliases), and the runner learns of them through the Secret (see
//     sidecars); what cannot map is a permanent error;
//   - the executor environment (credentials) is in the Secret
//     <NamePrefix><id>-env, never in the Pod spec: the runner container reads
//     it with envFrom, and the Secret's owner reference names the Pod, so the
//     garbage collector deletes it with the Pod;
//   - the identity comes one of two ways. Without a Minter, a SPIRE entry
//     EntryID(EntryIDPrefix, <id>): SPIFFE ID = the task's, parent = the
//     k8s_psat agent of the Pod's node, selectors k8s:ns:<namespace> and
//     k8s:pod-uid:<Pod UID>, registered once the Pod is scheduled; the
//     node's agent hands the SVID out once it has synced the entry. With a
//     Minter (Config.Minter), an X.509-SVID minted for the task before the
//     Pod is created and written into its Secret with the rest of the
//     environment: the runner holds it from its first instruction.
//
// Ordering and crash windows. The Pod is created first and the Secret second,
// with its owner reference already set (an owner reference needs the Pod's
// UID). So a Secret never exists without its Pod and can never outlive it.
// The one window is a Pod without its Secret (a crash, or an error, between
// the two writes). Such a Pod cannot start: its runner container waits for
// the non-optional Secret. Find reports a Pending Pod whose Secret is missing
// (or owned by an earlier Pod of the same name) as absent, so the worker calls
// Create again, which meets AlreadyExists on the Pod and writes the Secret;
// the environment is deterministic (bootstrap), so nothing is lost. Delete
// removes the SPIRE entry first (the identity goes before the workload), then
// the Pod, then the Secret; a crash in between is finished by the next Delete,
// or by the garbage collector for the Secret.
package pod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// Defaults of the optional Config fields.
const (
	DefaultNamePrefix    = "gdr-"
	DefaultEntryIDPrefix = "gdr-"
	DefaultExpiryMargin  = 15 * time.Minute
	DefaultPageSize      = 500
)

// secretSuffix turns a Pod name into its Secret's name. Pod names end in the
// task ID's digits, so no Pod name ends in it.
const secretSuffix = "-env"

// Config configures a Backend. Fields without a default are required.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	Keys      taskassignment.Keys
	// TrustDomain is the trust domain of executor identities and of the
	// SPIRE agents.
	TrustDomain spiffeid.TrustDomain
	// Pools are the installation's runner pools; every pool whose backend is
	// "pod" needs a Profile (see Profile). Other pools are ignored.
	Pools runnerpool.Pools
	// Entries is the SPIRE Server Entry API.
	Entries EntryClient
	// Minter, when set, gives each Pod its X.509-SVID at creation instead:
	// minted for the task's SPIFFE ID (bootstrap.SVIDEnvironment), valid for
	// the pool's job timeout + ExpiryMargin, and written into the Pod's
	// Secret, so the runner holds its identity from its first instruction
	// and waits for no SPIRE agent. Such Pods mount no Workload API and get
	// no registration entry (Delete still removes one an earlier Pod of the
	// assignment may have). Without it, BindIdentity registers an entry and
	// the node's SPIRE agent delivers the SVID once it has synced it.
	Minter bootstrap.Minter
	// Cluster is the cluster name the SPIRE k8s_psat node attestor is
	// configured with: it is part of every agent's SPIFFE ID.
	Cluster string
	// EntryIDPrefix prefixes every entry ID the backend creates (see
	// EntryID); SPIRE permissions can be scoped to it. Default "gdr-".
	EntryIDPrefix string
	// ExpiryMargin is added to the job timeout for an entry's expiry.
	// Default 15m.
	ExpiryMargin time.Duration
	// NamePrefix prefixes Pod names. Default "gdr-".
	NamePrefix string
	// PageSize is the List page size of RecoverAssignments. Default 500.
	PageSize int64
	// OnCorrupt, if set, is called for every Pod RecoverAssignments skips
	// because its metadata does not rebuild an assignment. It must not block.
	OnCorrupt func(Corrupt)
	// CorruptEvents makes RecoverAssignments also record a Warning Event
	// (reason CorruptExecutorMetadata) on each such Pod, best effort.
	CorruptEvents bool
	// Now is the clock for entry expiry and for how long a Pod has been
	// stuck (Stuck). Default time.Now.
	Now func() time.Time
}

// Corrupt describes a Pod of this installation whose metadata does not
// rebuild an assignment. Err names the key or value at fault (metadata only,
// which never holds credentials).
type Corrupt struct {
	Namespace, Pod string
	UID            ktypes.UID
	Err            error
}

// Backend is the Pod backend. It is safe for concurrent use; it holds no
// state beyond its configuration.
type Backend struct {
	client        kubernetes.Interface
	ns            string
	keys          taskassignment.Keys
	td            spiffeid.TrustDomain
	pools         map[string]poolTemplate
	entries       EntryClient
	minter        bootstrap.Minter
	cluster       string
	entryPrefix   string
	margin        time.Duration
	namePrefix    string
	pageSize      int64
	onCorrupt     func(Corrupt)
	corruptEvents bool
	now           func() time.Time
}

type poolTemplate struct {
	template corev1.PodTemplateSpec
	// direct, if set, is the template for a job without `container:`: its
	// image holds the runner (Profile.RunnerInImage).
	direct  *corev1.PodTemplateSpec
	timeout time.Duration
	// serviceTimeout bounds the runner's wait for the job's services.
	serviceTimeout time.Duration
	// serviceMemory is the memory of a service without --memory.
	serviceMemory resource.Quantity
	// pool is the runner pool itself (its images rule).
	pool runnerpool.Pool
}

var _ executor.Backend = (*Backend)(nil)

// New validates cfg and parses the pod template of every pod pool. Errors
// name the setting, or the pool and the profile field, at fault.
func New(cfg Config) (*Backend, error) {
	b := &Backend{
		client: cfg.Client, ns: cfg.Namespace, keys: cfg.Keys, td: cfg.TrustDomain,
		entries: cfg.Entries, minter: cfg.Minter, cluster: cfg.Cluster,
		entryPrefix: cfg.EntryIDPrefix, margin: cfg.ExpiryMargin, namePrefix: cfg.NamePrefix,
		pageSize: cfg.PageSize, onCorrupt: cfg.OnCorrupt, corruptEvents: cfg.CorruptEvents, now: cfg.Now,
		pools: map[string]poolTemplate{},
	}
	if b.entryPrefix == "" {
		b.entryPrefix = DefaultEntryIDPrefix
	}
	if b.margin == 0 {
		b.margin = DefaultExpiryMargin
	}
	if b.namePrefix == "" {
		b.namePrefix = DefaultNamePrefix
	}
	if b.pageSize == 0 {
		b.pageSize = DefaultPageSize
	}
	if b.now == nil {
		b.now = time.Now
	}
	switch {
	case b.client == nil:
		return nil, errors.New("pod backend: no Kubernetes client")
	case b.entries == nil && b.minter == nil:
		return nil, errors.New("pod backend: no SPIRE entry client (the workload API's identity needs one)")
	case b.keys.Runner == "" || b.keys.AssignmentID == "":
		return nil, errors.New("pod backend: no metadata keys")
	case b.td.IsZero():
		return nil, errors.New("pod backend: no trust domain")
	case b.margin < 0:
		return nil, fmt.Errorf("pod backend: expiry margin %s is negative", b.margin)
	case b.pageSize < 0:
		return nil, fmt.Errorf("pod backend: page size %d is negative", b.pageSize)
	}
	if errs := validation.IsDNS1123Label(b.ns); len(errs) > 0 {
		return nil, fmt.Errorf("pod backend: namespace %q: %s", b.ns, strings.Join(errs, "; "))
	}
	// The longest assignment ID is a label value's 63 characters.
	if errs := validation.IsDNS1123Subdomain(b.namePrefix + strings.Repeat("a", validation.LabelValueMaxLength) + secretSuffix); len(errs) > 0 {
		return nil, fmt.Errorf("pod backend: name prefix %q does not make valid Pod and Secret names: %s", b.namePrefix, strings.Join(errs, "; "))
	}
	if err := validEntryIDPrefix(b.entryPrefix); err != nil {
		return nil, fmt.Errorf("pod backend: %w", err)
	}
	// The cluster name is the agents' (entries name them as parents): with
	// no entry client, no SPIRE and no need of it.
	if _, err := agentID(b.td, b.cluster, "node-uid"); b.entries != nil && (err != nil || b.cluster == "") {
		return nil, fmt.Errorf("pod backend: cluster name %q is not a SPIFFE ID path segment", b.cluster)
	}
	for _, p := range cfg.Pools {
		if p.Backend != taskassignment.BackendPod {
			continue
		}
		ts, err := parseProfile(p.Profile, b.keys, b.minter == nil)
		if err != nil {
			return nil, fmt.Errorf("pod backend: pool %q: %w", p.Name, err)
		}
		st, sm, err := serviceDefaults(p.Profile)
		if err != nil {
			return nil, fmt.Errorf("pod backend: pool %q: %w", p.Name, err)
		}
		b.pools[p.Name] = poolTemplate{template: ts.install, direct: ts.direct, timeout: p.Timeout(), serviceTimeout: st, serviceMemory: sm, pool: p}
	}
	if len(b.pools) == 0 {
		return nil, errors.New("pod backend: no runner pool uses the pod backend")
	}
	return b, nil
}

// PodName returns the name of the Pod of an assignment.
func (b *Backend) PodName(assignmentID string) string { return b.namePrefix + assignmentID }

// SecretName returns the name of the Secret of the Pod podName.
func SecretName(podName string) string { return podName + secretSuffix }

// assignmentOf inverts PodName.
func (b *Backend) assignmentOf(podName string) (string, error) {
	id, ok := strings.CutPrefix(podName, b.namePrefix)
	if !ok {
		return "", fmt.Errorf("pod backend: %q is not a Pod name of this backend (prefix %q)", podName, b.namePrefix)
	}
	if _, _, err := taskassignment.ParseID(id); err != nil {
		return "", fmt.Errorf("pod backend: Pod name %q: %w", podName, err)
	}
	return id, nil
}

// Find returns the executor of an assignment: the Pod named PodName(id)
// among those labelled with the assignment ID. It returns nil without error
// when there is none, and also when the Pod is Pending without its Secret
// (the crash window of Create, which Create repairs). A Pod carrying the
// label under another name is an error: something else claims the
// assignment. IdentityTarget is the UID of the Pod's Node once the Pod is
// scheduled and the Node exists, else empty; with a Minter, the Pod's UID.
func (b *Backend) Find(ctx context.Context, assignmentID string) (*executor.Executor, error) {
	if _, _, err := taskassignment.ParseID(assignmentID); err != nil {
		return nil, fmt.Errorf("pod backend: find: %w", err)
	}
	sel, err := labels.ValidatedSelectorFromSet(labels.Set{b.keys.Runner: "true", b.keys.AssignmentID: assignmentID})
	if err != nil {
		return nil, fmt.Errorf("pod backend: find assignment %s: %w", assignmentID, err)
	}
	list, err := b.client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("pod backend: list Pods of assignment %s in namespace %s: %w", assignmentID, b.ns, err)
	}
	name := b.PodName(assignmentID)
	var (
		pod    *corev1.Pod
		others []string
	)
	for i := range list.Items {
		if list.Items[i].Name == name {
			pod = &list.Items[i]
		} else {
			others = append(others, list.Items[i].Name)
		}
	}
	if pod == nil {
		if len(others) > 0 {
			return nil, fmt.Errorf("pod backend: Pods %v in namespace %s carry assignment %s but are not named %s",
				others, b.ns, assignmentID, name)
		}
		return nil, nil
	}
	if needsSecret(pod) {
		ok, err := b.hasSecret(ctx, pod)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, nil
		}
	}
	return b.executor(ctx, pod)
}

// Create creates the Pod of assignment a from its pool's template and then
// its Secret holding spec.Environment. If the Pod exists already (a
// redelivery, a crash), Create completes it and returns it; a Pod of that
// name that belongs to another assignment is an error.
//
// Errors no retry can fix are marked executor.Permanent: an assignment
// this backend has no pool for, a template that collides with the executor
// environment, a Pod the API server rejects as Invalid (422), and a Pod of
// that name that belongs to another assignment. Everything else (403, 5xx,
// timeouts, a quota) stays transient: an operator can fix RBAC or capacity
// and the next delivery succeeds.
func (b *Backend) Create(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec) (*executor.Executor, error) {
	if a.Backend != taskassignment.BackendPod {
		return nil, executor.Permanent(fmt.Errorf("pod backend: assignment %s is for backend %q", a.ID, a.Backend))
	}
	if _, _, err := taskassignment.ParseID(a.ID); err != nil {
		return nil, executor.Permanent(fmt.Errorf("pod backend: create: %w", err))
	}
	pt, ok := b.pools[a.Task.Pool]
	if !ok {
		return nil, executor.Permanent(fmt.Errorf("pod backend: assignment %s: runner pool %q is not a pod pool of this backend", a.ID, a.Task.Pool))
	}
	if err := pt.pool.CheckImages(a.Task); err != nil {
		return nil, executor.Permanent(fmt.Errorf("pod backend: assignment %s: %w", a.ID, err))
	}
	if spec.Metadata.Labels[b.keys.AssignmentID] != a.ID || spec.Metadata.Labels[b.keys.Runner] != "true" {
		return nil, executor.Permanent(fmt.Errorf("pod backend: assignment %s: launch metadata lacks the runner and assignment-id labels", a.ID))
	}
	if a.Task.Image != "" || len(a.Task.Services) > 0 {
		env := make(map[string]string, len(spec.Environment)+3)
		maps.Copy(env, spec.Environment)
		if a.Task.Image != "" {
			// The runner container runs the job's own image: tell the
			// runner, so that it runs the job's `container:` on its host.
			env[bootstrap.EnvJobImage] = a.Task.Image
		}
		if len(a.Task.Services) > 0 {
			// The services run as sidecars: tell the runner which, and how
			// long to wait for their ports.
			env[bootstrap.EnvJobServices] = strings.Join(jobservices.IDs(a.Task.Services), ",")
			env[bootstrap.EnvServiceTimeout] = pt.serviceTimeout.String()
		}
		spec.Environment = env
	}
	if b.minter != nil {
		// Minted before the Pod exists: a mint that fails leaves nothing
		// behind, and the Pod waits for its Secret no longer than before.
		var err error
		if spec, err = b.withSVID(ctx, a, spec, pt); err != nil {
			return nil, err
		}
	}
	pod, err := b.newPod(a, spec, pt)
	if err != nil {
		return nil, executor.Permanent(err)
	}
	created, err := b.client.CoreV1().Pods(b.ns).Create(ctx, pod, metav1.CreateOptions{})
	switch {
	case err == nil:
		pod = created
	case apierrors.IsAlreadyExists(err):
		if pod, err = b.client.CoreV1().Pods(b.ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("pod backend: get existing Pod %s: %w", b.PodName(a.ID), err)
		}
		if got := pod.Labels[b.keys.AssignmentID]; got != a.ID {
			// Pod names are a function of the assignment ID: another
			// assignment's Pod under this name is not going away by itself.
			return nil, executor.Permanent(fmt.Errorf("pod backend: Pod %s exists and belongs to assignment %q, not %s", pod.Name, got, a.ID))
		}
	case apierrors.IsInvalid(err):
		// The template or the job's image makes a Pod the API server will
		// never accept; its message names the field.
		return nil, executor.Permanent(fmt.Errorf("pod backend: create Pod %s in namespace %s: %w", pod.Name, b.ns, err))
	default:
		return nil, fmt.Errorf("pod backend: create Pod %s in namespace %s: %w", pod.Name, b.ns, err)
	}
	if needsSecret(pod) {
		if err := b.ensureSecret(ctx, pod, spec.Environment); err != nil {
			return nil, err
		}
	}
	return b.executor(ctx, pod)
}

// withSVID returns spec with a freshly minted X.509-SVID for a's identity
// added to its environment (bootstrap.SVIDEnvironment), valid for the pool's
// job timeout + ExpiryMargin: the Pod's whole life, since its
// activeDeadlineSeconds is that timeout. A failed mint is transient (see
// spiremint): nothing exists yet, and the next delivery mints afresh. A
// redelivery mints again and keeps the SVID already in the Secret (see
// ensureSecret); SPIRE keeps no state of an unused one.
func (b *Backend) withSVID(ctx context.Context, a taskassignment.Assignment, spec executor.LaunchSpec, pt poolTemplate) (executor.LaunchSpec, error) {
	id, err := spiffeid.FromString(a.Identity.SPIFFEID)
	if err != nil {
		return spec, executor.Permanent(fmt.Errorf("pod backend: assignment %s: SPIFFE ID: %w", a.ID, err))
	}
	if !id.MemberOf(b.td) {
		return spec, executor.Permanent(fmt.Errorf("pod backend: assignment %s: %s is outside trust domain %s", a.ID, id, b.td.Name()))
	}
	svid, err := bootstrap.SVIDEnvironment(ctx, b.minter, id, pt.timeout+b.margin)
	if err != nil {
		return spec, fmt.Errorf("pod backend: assignment %s: %w", a.ID, err)
	}
	env := make(map[string]string, len(spec.Environment)+len(svid))
	maps.Copy(env, spec.Environment)
	maps.Copy(env, svid)
	spec.Environment = env
	return spec, nil
}

// newPod builds the Pod of a from the pool template. The environment's
// names are checked against the template; its values go only into the Secret.
func (b *Backend) newPod(a taskassignment.Assignment, spec executor.LaunchSpec, pt poolTemplate) (*corev1.Pod, error) {
	t := pt.template.DeepCopy()
	if a.Task.Image == "" && pt.direct != nil {
		t = pt.direct.DeepCopy()
	}
	pod := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Name, pod.Namespace = b.PodName(a.ID), b.ns
	pod.Labels = merged(t.Labels, spec.Metadata.Labels)
	pod.Annotations = merged(t.Annotations, spec.Metadata.Annotations)
	// A running job is not the cluster autoscaler's to move: it cannot
	// resume elsewhere. (Voluntary evictions, kubectl drain's, are held off
	// by the executors' PodDisruptionBudget, deploy/base.)
	pod.Annotations[SafeToEvict] = "false"
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	deadline := int64(math.Ceil(pt.timeout.Seconds()))
	pod.Spec.ActiveDeadlineSeconds = &deadline
	services, volumes, alias, err := sidecars(a.Task.Services, pt.serviceMemory)
	if err != nil {
		return nil, fmt.Errorf("pod backend: assignment %s: %w", a.ID, err)
	}
	// The images the job chose are pulled as the pool's images.pullPolicy
	// says (Always by default: the node asks the registry with this Pod's
	// credentials, so a private image another pool left on the node is not
	// run from its cache); the template's own images as the template says.
	pull := corev1.PullPolicy(pt.pool.Images.Pull())
	for i := range services {
		services[i].ImagePullPolicy = pull
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, services...)
	pod.Spec.Volumes = append(pod.Spec.Volumes, volumes...)
	if alias != nil {
		pod.Spec.HostAliases = append(pod.Spec.HostAliases, *alias)
	}
	c := &pod.Spec.Containers[runnerIndex(pod.Spec.Containers)]
	if a.Task.Image != "" {
		c.Image, c.ImagePullPolicy = a.Task.Image, pull
	}
	for _, e := range c.Env {
		if _, ok := spec.Environment[e.Name]; ok {
			return nil, fmt.Errorf("pod backend: pool %q: container %q of the pod template sets %s, which the executor environment provides",
				a.Task.Pool, RunnerContainer, e.Name)
		}
	}
	optional := false
	c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(pod.Name)},
		Optional:             &optional,
	}})
	return pod, nil
}

// SafeToEvict is the cluster autoscaler's annotation; every executor Pod
// carries it as "false", whatever its pool's template says.
const SafeToEvict = "cluster-autoscaler.kubernetes.io/safe-to-evict"

func merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// needsSecret reports whether a Pod still depends on its Secret being
// written: it has not started and is not going away.
func needsSecret(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && (pod.Status.Phase == "" || pod.Status.Phase == corev1.PodPending)
}

func ownedBy(obj metav1.Object, uid ktypes.UID) bool {
	for _, o := range obj.GetOwnerReferences() {
		if o.UID == uid && o.Kind == "Pod" {
			return true
		}
	}
	return false
}

// hasSecret reports whether the Pod's Secret exists and is owned by this Pod
// (not by an earlier Pod of the same name, whose collection would take it).
func (b *Backend) hasSecret(ctx context.Context, pod *corev1.Pod) (bool, error) {
	s, err := b.client.CoreV1().Secrets(b.ns).Get(ctx, SecretName(pod.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, secretError("get", SecretName(pod.Name), err)
	}
	return ownedBy(s, pod.UID), nil
}

// ensureSecret writes the Pod's Secret, owned by the Pod. An existing Secret
// with other data or another owner is brought up to date.
func (b *Backend) ensureSecret(ctx context.Context, pod *corev1.Pod, env map[string]string) error {
	name := SecretName(pod.Name)
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: b.ns,
			Labels: map[string]string{
				b.keys.Runner:       "true",
				b.keys.AssignmentID: pod.Labels[b.keys.AssignmentID],
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: make(map[string][]byte, len(env)),
	}
	for k, v := range env {
		want.Data[k] = []byte(v)
	}
	secrets := b.client.CoreV1().Secrets(b.ns)
	_, err := secrets.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return secretError("create", name, err)
	}
	got, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return secretError("get", name, err)
	}
	if ownedBy(got, pod.UID) && b.sameEnvironment(got.Data, want.Data) {
		return nil
	}
	got.OwnerReferences, got.Data, got.StringData = want.OwnerReferences, want.Data, nil
	got.Labels = merged(got.Labels, want.Labels)
	if _, err := secrets.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		return secretError("update", name, err)
	}
	return nil
}

// sameEnvironment reports whether a Secret's data got holds the environment
// want. A minted SVID differs on every Create: the one in got stands, as long
// as got has one (its runner may already hold it).
func (b *Backend) sameEnvironment(got, want map[string][]byte) bool {
	if b.minter == nil {
		return maps.EqualFunc(got, want, bytes.Equal)
	}
	minted := bootstrap.SVIDVariables()
	for _, k := range minted {
		if len(got[k]) == 0 {
			return false
		}
	}
	fixed := func(m map[string][]byte) map[string][]byte {
		return maps.Collect(func(yield func(string, []byte) bool) {
			for k, v := range m {
				if !slices.Contains(minted, k) && !yield(k, v) {
					return
				}
			}
		})
	}
	return maps.EqualFunc(fixed(got), fixed(want), bytes.Equal)
}

// secretAPIError reports a failed Secret call by its status reason only: the
// API server's message is never shown, so no part of a request body can
// reach a log. Unwrap keeps apierrors.IsNotFound and friends working.
type secretAPIError struct {
	op, name string
	err      error
}

func secretError(op, name string, err error) error {
	return &secretAPIError{op: op, name: name, err: err}
}

func (e *secretAPIError) Error() string {
	reason := string(apierrors.ReasonForError(e.err))
	if reason == "" {
		if errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded) {
			reason = e.err.Error()
		} else {
			reason = "request failed"
		}
	}
	return fmt.Sprintf("pod backend: %s Secret %s: %s", e.op, e.name, reason)
}

func (e *secretAPIError) Unwrap() error { return e.err }

// executor describes pod, resolving its identity target: the UID of its
// Node, or with a Minter the Pod's own UID (its SVID is in its Secret from
// the start, see Config.Minter).
func (b *Backend) executor(ctx context.Context, pod *corev1.Pod) (*executor.Executor, error) {
	target := string(pod.UID)
	if b.minter == nil {
		var err error
		if target, err = b.nodeUID(ctx, pod); err != nil {
			return nil, err
		}
	}
	e := &executor.Executor{Name: pod.Name, IdentityTarget: target, Phase: PhaseOf(pod)}
	if reason := Stuck(pod, b.now()); reason != "" && e.Phase == executor.PhasePending {
		// It would wait until its deadline: fail it now, with kubelet's reason.
		e.Phase, e.Reason = executor.PhaseFailed, reason
	}
	return e, nil
}

// nodeUID returns the UID of the Node the Pod is scheduled to, or "" while
// it is not scheduled or the Node object does not exist.
func (b *Backend) nodeUID(ctx context.Context, pod *corev1.Pod) (string, error) {
	if pod.Spec.NodeName == "" {
		return "", nil
	}
	node, err := b.client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pod backend: get Node %s of Pod %s: %w", pod.Spec.NodeName, pod.Name, err)
	}
	return string(node.UID), nil
}

// BindIdentity registers the SPIRE entry that gives the executor's Pod its
// SPIFFE ID (see the package doc). It checks that the Pod carries exactly
// that identity and still runs on the node of e.IdentityTarget (a stale
// executor is an error: Find again). Binding again is success; an entry under
// the same ID for an earlier Pod of the assignment is replaced; an entry for
// another SPIFFE ID is ErrEntryConflict. Expiry is now + the Pod's
// activeDeadlineSeconds + ExpiryMargin, set when the entry is created.
func (b *Backend) BindIdentity(ctx context.Context, e *executor.Executor, id taskidentity.Identity) error {
	if e == nil {
		return errors.New("pod backend: bind identity: no executor")
	}
	assignmentID, err := b.assignmentOf(e.Name)
	if err != nil {
		return err
	}
	if e.IdentityTarget == "" {
		return fmt.Errorf("pod backend: bind identity: Pod %s has no identity target yet", e.Name)
	}
	sid, err := spiffeid.FromString(id.SPIFFEID)
	if err != nil {
		return fmt.Errorf("pod backend: bind identity of Pod %s: %w", e.Name, err)
	}
	if !sid.MemberOf(b.td) {
		return fmt.Errorf("pod backend: bind identity of Pod %s: %s is outside trust domain %s", e.Name, sid, b.td.Name())
	}
	pod, err := b.client.CoreV1().Pods(b.ns).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("pod backend: bind identity: get Pod %s: %w", e.Name, err)
	}
	if got := pod.Labels[b.keys.AssignmentID]; got != assignmentID {
		return fmt.Errorf("pod backend: bind identity: Pod %s belongs to assignment %q, not %s", e.Name, got, assignmentID)
	}
	if got := pod.Annotations[b.keys.SPIFFEID]; got != sid.String() {
		return fmt.Errorf("pod backend: bind identity: Pod %s carries SPIFFE ID %q, not %s", e.Name, got, sid)
	}
	if b.minter != nil {
		// The identity went into the Pod's Secret when it was created.
		if string(pod.UID) != e.IdentityTarget {
			return fmt.Errorf("pod backend: bind identity: Pod %s is not the Pod %q it was created as: the executor is stale", e.Name, e.IdentityTarget)
		}
		ok, err := b.hasSecret(ctx, pod)
		if err != nil {
			return fmt.Errorf("pod backend: bind identity of Pod %s: %w", e.Name, err)
		}
		if !ok {
			return fmt.Errorf("pod backend: bind identity: Pod %s has no Secret of its own, hence no SVID: the executor is stale", e.Name)
		}
		return nil
	}
	node, err := b.nodeUID(ctx, pod)
	if err != nil {
		return err
	}
	if node != e.IdentityTarget {
		return fmt.Errorf("pod backend: bind identity: Pod %s is on node %q, not %q: the executor is stale", e.Name, node, e.IdentityTarget)
	}
	parent, err := agentID(b.td, b.cluster, node)
	if err != nil {
		return fmt.Errorf("pod backend: bind identity of Pod %s: %w", e.Name, err)
	}
	timeout := runnerpool.DefaultJobTimeout
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil && *d > 0 {
		timeout = time.Duration(*d) * time.Second
	}
	expires := b.now().Add(timeout + b.margin).Unix()
	entry := podEntry(EntryID(b.entryPrefix, assignmentID), sid, parent, pod.Namespace, string(pod.UID), expires)
	if err := ensureEntry(ctx, b.entries, entry); err != nil {
		return fmt.Errorf("pod backend: bind identity of Pod %s: %w", e.Name, err)
	}
	return nil
}

// Delete removes the executor's SPIRE entry, its Pod and its Secret, in that
// order. Whatever is already gone counts as deleted. The Pod is deleted
// gracefully: it may stay visible, being deleted (PhaseUnknown), until its
// kubelet confirms.
func (b *Backend) Delete(ctx context.Context, e *executor.Executor) error {
	if e == nil {
		return errors.New("pod backend: delete: no executor")
	}
	assignmentID, err := b.assignmentOf(e.Name)
	if err != nil {
		return err
	}
	// Without an entry client (the installation's CA mints) there is no SPIRE
	// and so no entry; with one, an entry a workload-api Pod had goes first.
	if b.entries != nil {
		if err := deleteEntry(ctx, b.entries, EntryID(b.entryPrefix, assignmentID)); err != nil {
			return fmt.Errorf("pod backend: delete executor %s: %w", e.Name, err)
		}
	}
	err = b.client.CoreV1().Pods(b.ns).Delete(ctx, e.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("pod backend: delete Pod %s: %w", e.Name, err)
	}
	err = b.client.CoreV1().Secrets(b.ns).Delete(ctx, SecretName(e.Name), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return secretError("delete", SecretName(e.Name), err)
	}
	return nil
}

// Discard deletes what Create may have left of assignmentID's executor
// without Find returning it: a Pod whose Secret was never created (a handle
// killed between the two), which would otherwise wait for its Secret, and
// hold its node's requests, for ever once the task is over. executor.Worker calls
// it (recover, with pods delete) when the task is over and Find found
// nothing. Nothing there is success; a Pod of that name that carries another
// assignment, or is not of this installation, is left alone.
func (b *Backend) Discard(ctx context.Context, assignmentID string) error {
	name := b.PodName(assignmentID)
	pod, err := b.client.CoreV1().Pods(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("pod backend: discard assignment %s: get Pod %s: %w", assignmentID, name, err)
	case pod.Labels[b.keys.Runner] != "true" || pod.Labels[b.keys.AssignmentID] != assignmentID:
		return nil
	}
	return b.Delete(ctx, &executor.Executor{Name: name})
}

// RecoverAssignments lists every Pod of this installation (the runner label)
// in the namespace, PageSize at a time, and rebuilds each one's assignment
// from its metadata alone. A Pod whose metadata does not rebuild, is not for
// the pod backend, or is not named after its assignment is reported through
// OnCorrupt (and an Event when CorruptEvents is set) and skipped. The API
// calls are the pages, plus one per Event.
func (b *Backend) RecoverAssignments(ctx context.Context) ([]taskassignment.Assignment, error) {
	opts := metav1.ListOptions{
		LabelSelector: labels.SelectorFromValidatedSet(b.keys.RunnerSelector()).String(),
		Limit:         b.pageSize,
	}
	var out []taskassignment.Assignment
	for {
		list, err := b.client.CoreV1().Pods(b.ns).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("pod backend: list executor Pods in namespace %s: %w", b.ns, err)
		}
		for i := range list.Items {
			pod := &list.Items[i]
			a, err := b.assignmentOfPod(pod)
			if err != nil {
				b.reportCorrupt(ctx, pod, err)
				continue
			}
			out = append(out, a)
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

func (b *Backend) assignmentOfPod(pod *corev1.Pod) (taskassignment.Assignment, error) {
	a, err := b.keys.FromMetadata(pod.Labels, pod.Annotations, b.td)
	if err != nil {
		return taskassignment.Assignment{}, err
	}
	if a.Backend != taskassignment.BackendPod {
		return taskassignment.Assignment{}, fmt.Errorf("metadata: backend is %q, not %q", a.Backend, taskassignment.BackendPod)
	}
	if want := b.PodName(a.ID); pod.Name != want {
		return taskassignment.Assignment{}, fmt.Errorf("metadata: assignment %s belongs to Pod %s", a.ID, want)
	}
	return a, nil
}

func (b *Backend) reportCorrupt(ctx context.Context, pod *corev1.Pod, err error) {
	if b.onCorrupt != nil {
		b.onCorrupt(Corrupt{Namespace: pod.Namespace, Pod: pod.Name, UID: pod.UID, Err: err})
	}
	if !b.corruptEvents {
		return
	}
	now := metav1.NewTime(b.now())
	msg := "executor metadata does not rebuild an assignment; recover skips this Pod: " + err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()),
			Namespace: pod.Namespace,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		Reason:         "CorruptExecutorMetadata",
		Message:        msg,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "gitea-dynamic-runner"},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	// Best effort: an Event that cannot be written must not stop recovery.
	_, _ = b.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{})
}
