package deploy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"mvdan.cc/sh/v3/syntax"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/bootstrap"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// docs/OPERATIONS.md's "Rotating secrets" is meant to be run as written, with jobs running, by
// a cluster test: each ```sh block of the section carries a marker comment on the line before it,
//
//	<!-- ops-test: rotate SECRET PHASE -->
//
// and the cluster test runs the blocks by that name. TestOpsBlocks checks the markers and what
// the blocks may call; TestOpsRotationBlocks runs every block, in its order, against a fake
// kubectl (deploy/testdata/fakekube).

// rotationNames are the blocks of "Rotating secrets", in order.
var rotationNames = []string{
	"rotate payload-key add", "rotate payload-key swap", "rotate payload-key drop",
	"rotate bootstrap-key add", "rotate bootstrap-key swap", "rotate bootstrap-key drop",
	"rotate webhook-secret add", "rotate webhook-secret swap", "rotate webhook-secret drop",
	"rotate runner-credentials register", "rotate runner-credentials pause", "rotate runner-credentials swap",
	"rotate runner-credentials swap-helm", "rotate runner-credentials resume",
	"rotate nats-credentials add", "rotate nats-credentials reload", "rotate nats-credentials swap", "rotate nats-credentials drop",
	"rotate ca swap", "rotate ca drop",
}

// opsCommands are the commands a block may run: kubectl and coreutils; go (this checkout's
// dispatch register, nk) and sed only where the rotation needs them.
var (
	opsCommands = []string{"kubectl", "base64", "head", "tail", "cat", "cp", "mv", "rm", "mkdir", "printf", "echo",
		"tr", "sort", "comm", "sleep", "umask", "trap", "date", "[", ":", "exit", "break", "running"}
	opsExtra = map[string][]string{
		"rotate runner-credentials register": {"go"},
		"rotate nats-credentials add":        {"go", "sed", "grep"},
	}
)

// rotationBlock is one sh block of docs/OPERATIONS.md's "Rotating secrets": name is its marker's
// "rotate SECRET PHASE" ("" for none).
type rotationBlock struct {
	name, text string
	line       int
}

// rotationBlocks returns the sh blocks of docs/OPERATIONS.md's "Rotating secrets" (docBlocks).
func rotationBlocks(t testing.TB) []rotationBlock {
	t.Helper()
	var out []rotationBlock
	for _, b := range docBlocks(t, operationsDoc, opsMarker) {
		if b.section != "## Rotating secrets" {
			continue
		}
		name := b.phase
		if b.name != "" {
			name += " " + b.name
		}
		out = append(out, rotationBlock{name: name, text: b.text, line: b.line})
	}
	if len(out) == 0 {
		t.Fatal(`docs/OPERATIONS.md has no sh block under "## Rotating secrets"`)
	}
	return out
}

// TestOpsBlocks: every sh block of "Rotating secrets" is marked, the marked blocks are
// exactly rotationNames in order, each parses (bash -n), calls only kubectl and coreutils (go and sed
// where opsExtra allows), and uses no variable it does not set but GITEA (optional).
func TestOpsBlocks(t *testing.T) {
	var names []string
	for _, b := range rotationBlocks(t) {
		where := fmt.Sprintf("docs/OPERATIONS.md:%d", b.line)
		if b.name == "" {
			t.Errorf("%s: an sh block without an ops-test marker", where)
			continue
		}
		names = append(names, b.name)
		if out, err := exec.Command("bash", "-n", "-c", b.text).CombinedOutput(); err != nil {
			t.Errorf("%s %s: bash -n: %v\n%s", where, b.name, err, out)
		}
		f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(b.text), b.name)
		if err != nil {
			t.Errorf("%s %s: %v", where, b.name, err)
			continue
		}
		allowed := append(slices.Clone(opsCommands), opsExtra[b.name]...)
		own, uses, calls := shellNames(f)
		for _, cmd := range calls {
			if !slices.Contains(allowed, cmd) {
				t.Errorf("%s %s: runs %q, not one of %q", where, b.name, cmd, allowed)
			}
		}
		for v := range uses {
			if !own[v] && v != "GITEA" {
				t.Errorf("%s %s: uses $%s, which it does not set", where, b.name, v)
			}
		}
	}
	if !slices.Equal(names, rotationNames) {
		t.Errorf("ops-test blocks %q, want %q (the cluster test runs them by name)", names, rotationNames)
	}
}

// fakeState mirrors deploy/testdata/fakekube's State.
type fakeState struct {
	Secrets    map[string]map[string]string `json:"secrets"`
	ConfigMaps map[string]map[string]string `json:"configmaps"`
	Pods       []fakePod                    `json:"pods"`
	Log        []string                     `json:"log"`
	Serial     int                          `json:"serial"`
}

type fakePod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Phase     string            `json:"phase"`
	Labels    map[string]string `json:"labels"`
}

// opsRun is a folder the blocks run in, with a fake cluster.
type opsRun struct {
	t      *testing.T
	dir    string // the blocks' current folder, with gdr-keys/ and deploy/nats/
	bin    string // the fake kubectl and go
	state  string
	blocks map[string]string
}

// buildFakeKube builds deploy/testdata/fakekube as kubectl and go into a folder of t's.
func buildFakeKube(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "kubectl"), "./testdata/fakekube").CombinedOutput(); err != nil {
		t.Fatalf("build the fake kubectl: %v\n%s", err, out)
	}
	if err := os.Link(filepath.Join(bin, "kubectl"), filepath.Join(bin, "go")); err != nil {
		t.Fatal(err)
	}
	return bin
}

func newOpsRun(t *testing.T, bin string, initial fakeState) *opsRun {
	t.Helper()
	r := &opsRun{t: t, dir: t.TempDir(), bin: bin, blocks: map[string]string{}}
	r.state = filepath.Join(t.TempDir(), "state.json")
	for _, b := range rotationBlocks(t) {
		r.blocks[b.name] = b.text
	}
	conf, err := os.ReadFile(authorizationFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "deploy", "nats"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "deploy", "nats", "authorization.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(r.dir, "gdr-keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	r.save(initial)
	return r
}

func (r *opsRun) load() fakeState {
	r.t.Helper()
	data, err := os.ReadFile(r.state)
	if err != nil {
		r.t.Fatal(err)
	}
	var s fakeState
	if err := json.Unmarshal(data, &s); err != nil {
		r.t.Fatal(err)
	}
	return s
}

func (r *opsRun) save(s fakeState) {
	r.t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(r.state, data, 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// run runs block name as the cluster test does (bash -euo pipefail, the block as written) and
// returns its error and output.
func (r *opsRun) try(name string) (string, error) {
	r.t.Helper()
	text, ok := r.blocks[name]
	if !ok {
		r.t.Fatalf("no block %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a wait that never ends is a failure here
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", text)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "PATH="+r.bin+string(os.PathListSeparator)+os.Getenv("PATH"), "FAKEKUBE_STATE="+r.state)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (r *opsRun) run(name string) {
	r.t.Helper()
	if out, err := r.try(name); err != nil {
		r.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// finishJobs ends the Pods of handle's and recover's Jobs, as their deadlines do.
func (r *opsRun) finishJobs() {
	s := r.load()
	for i, p := range s.Pods {
		if n := p.Labels["app.kubernetes.io/name"]; n == "handle" || n == "recover" {
			s.Pods[i].Phase = "Succeeded"
		}
	}
	r.save(s)
}

func (r *opsRun) file(name string) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.dir, name))
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

func (r *opsRun) absent(names ...string) {
	r.t.Helper()
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(r.dir, n)); err == nil {
			r.t.Errorf("%s is left", n)
		}
	}
}

// logged reports whether the fake's log has each command, in order, since mark.
func (r *opsRun) logged(since int, want ...string) bool {
	log := r.load().Log[since:]
	for _, w := range want {
		i := slices.IndexFunc(log, func(l string) bool { return strings.Contains(l, w) })
		if i < 0 {
			return false
		}
		log = log[i+1:]
	}
	return true
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func unb64(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const opsNS = "gitea-dynamic-runner/"

// initialCluster is an install as deploy/README.md leaves it, running a job: dispatch and the
// gateway up, a handle and a recover Job running.
func initialCluster(t *testing.T) fakeState {
	pod := func(name, fn string) fakePod {
		return fakePod{Namespace: "gitea-dynamic-runner", Name: name, Phase: "Running",
			Labels: map[string]string{"app.kubernetes.io/name": fn, "app.kubernetes.io/part-of": "gitea-dynamic-runner"}}
	}
	s := fakeState{
		Secrets: map[string]map[string]string{
			opsNS + "gdr-secrets": {"payload-key": b64(strings.Repeat("A", 43) + "="), "bootstrap-key": b64(strings.Repeat("B", 43) + "="),
				"webhook-secret": b64("old-hook-secret"), "tick-token": b64("tick"), "assignment-signing-key": b64("sign")},
			opsNS + "gdr-runner-credentials": {"linux.json": b64(`{"id":1}`)},
			opsNS + "gdr-identity-ca":        {"ca.pem": b64("ROOT-0\n"), "ca-key.pem": b64("KEY")},
			opsNS + "gdr-gateway-svid":       {"issuer": b64("ROOT-0\n")},
		},
		ConfigMaps: map[string]map[string]string{
			opsNS + "gdr-config":          {"GDR_GITEA_URL": "http://gitea.gitea.svc:3000/"},
			opsNS + "gdr-pools":           {"pools.yaml": "pools:\n  - {name: linux, labels: [ubuntu-latest], backend: pod, capacity: 2}\n"},
			opsNS + "gdr-identity-bundle": {"bundle.pem": "ROOT-0\n"},
			"nats/nats-users":             {},
			"nats/nats-authorization":     {},
		},
		Pods: []fakePod{pod("dispatch-0", "dispatch"), pod("gateway-0", "gateway"), pod("handle-pod-0", "handle"), pod("recover-0", "recover")},
	}
	for _, u := range natsUsers {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		s.Secrets[opsNS+"gdr-nats-"+strings.ToLower(strings.ReplaceAll(u, "_", "-"))] = map[string]string{"nkey": b64(string(seed) + "\n" + pub + "\n")}
	}
	return s
}

// TestOpsRotationBlocks runs each rotation of docs/OPERATIONS.md, block by block as written,
// against a fake cluster, and checks what each phase leaves: the keys in the form the
// functions read them (their own checks pass), the old key listed from the add to the drop and
// the current one never lost (each block run twice changes nothing more), a second rotation
// refused while one is under way, the readers restarted, the Pods running at the swap listed
// for the drop's wait, and the rotation's files gone at the end. The NATS add's files are given
// to a real nats-server, which takes the old and the new key of every user.
func TestOpsRotationBlocks(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	bin := buildFakeKube(t)
	for _, k := range []struct {
		secret, key, old string
		restarts         string
		readers          []string // the Pods of the fake cluster the swap lists for the drop's wait
		check            func(t *testing.T, current string, old []string)
	}{
		{"payload-key", "payload-key", "payload-old-keys", "rollout restart deployment/dispatch deployment/gateway", []string{"pod/recover-0"},
			func(t *testing.T, current string, old []string) {
				s := assignmentqueue.PayloadSettings{}
				if err := s.PayloadKey.Decode(current); err != nil {
					t.Fatal(err)
				}
				if err := s.PayloadOldKeys.Decode(strings.Join(old, ",")); err != nil {
					t.Fatal(err)
				}
				if err := s.Check(); err != nil {
					t.Fatal(err)
				}
			}},
		{"bootstrap-key", "bootstrap-key", "bootstrap-old-keys", "rollout restart deployment/gateway", []string{"pod/handle-pod-0", "pod/recover-0"},
			func(t *testing.T, current string, old []string) {
				s := bootstrap.KeySettings{}
				if err := s.Key.Decode(current); err != nil {
					t.Fatal(err)
				}
				if err := s.OldKeys.Decode(strings.Join(old, ",")); err != nil {
					t.Fatal(err)
				}
				if err := s.Check(); err != nil {
					t.Fatal(err)
				}
			}},
		{"webhook-secret", "webhook-secret", "webhook-old-secrets", "rollout restart deployment/dispatch", nil,
			func(t *testing.T, current string, old []string) {
				if err := webhook.CheckOldSecrets(current, strings.Join(old, ",")); err != nil {
					t.Fatal(err)
				}
				if got := webhook.ParseSecrets(strings.Join(old, ",")); len(got) != len(old) {
					t.Fatalf("old secrets %d, want %d", len(got), len(old))
				}
			}},
	} {
		t.Run(k.secret, func(t *testing.T) {
			r := newOpsRun(t, bin, initialCluster(t))
			secret := func() (string, []string) {
				d := r.load().Secrets[opsNS+"gdr-secrets"]
				var old []string
				if v, ok := d[k.old]; ok {
					old = strings.Split(unb64(t, v), ",")
				}
				return unb64(t, d[k.key]), old
			}
			first, _ := secret()

			mark := len(r.load().Log)
			r.run("rotate " + k.secret + " add")
			r.run("rotate " + k.secret + " add")
			next := r.file("gdr-keys/rotate/" + k.key + ".new")
			if current, old := secret(); current != first || !slices.Equal(old, []string{next}) {
				t.Fatalf("after add: current changed %v, old %q, want the new key alone", current != first, old)
			} else {
				k.check(t, current, old)
			}
			if !r.logged(mark, k.restarts) {
				t.Errorf("add restarted nothing: %q", r.load().Log[mark:])
			}

			mark = len(r.load().Log)
			r.run("rotate " + k.secret + " swap")
			r.run("rotate " + k.secret + " swap")
			if current, old := secret(); current != next || !slices.Equal(old, []string{first}) {
				t.Fatalf("after swap: current is the new key %v, old is the first %v", current == next, slices.Equal(old, []string{first}))
			} else {
				k.check(t, current, old)
			}
			if got := r.file("gdr-keys/" + k.key); got != next {
				t.Errorf("gdr-keys/%s is not the new key", k.key)
			}
			if !r.logged(mark, k.restarts) {
				t.Errorf("swap restarted nothing: %q", r.load().Log[mark:])
			}
			if k.secret != "webhook-secret" {
				listed := r.file("gdr-keys/rotate/" + k.key + ".pods")
				for _, p := range k.readers {
					if !strings.Contains(listed, p+"\n") {
						t.Errorf("the Pods running at the swap %q lack %s", listed, p)
					}
				}
			}

			// Another rotation may not start while this one's old key is listed.
			if err := os.Rename(filepath.Join(r.dir, "gdr-keys/rotate/"+k.key+".new"), filepath.Join(r.dir, "kept")); err != nil {
				t.Fatal(err)
			}
			if out, err := r.try("rotate " + k.secret + " add"); err == nil || !strings.Contains(out, "finish the rotation under way") {
				t.Errorf("a second add during the rotation: %v\n%s", err, out)
			}
			if err := os.Rename(filepath.Join(r.dir, "kept"), filepath.Join(r.dir, "gdr-keys/rotate/"+k.key+".new")); err != nil {
				t.Fatal(err)
			}
			if current, old := secret(); current != next || !slices.Equal(old, []string{first}) {
				t.Fatal("the refused add changed the Secret")
			}

			r.finishJobs()
			mark = len(r.load().Log)
			r.run("rotate " + k.secret + " drop")
			if current, old := secret(); current != next || old != nil {
				t.Fatalf("after drop: current is the new key %v, old %q", current == next, old)
			}
			if k.secret != "webhook-secret" && !r.logged(mark, "wait --for=condition=Active=False scaledobject/gateway", "patch secret gdr-secrets") {
				t.Errorf("drop did not wait for an idle moment before dropping: %q", r.load().Log[mark:])
			}
			r.absent("gdr-keys/rotate/"+k.key+".new", "gdr-keys/rotate/"+k.key+".pods", "gdr-keys/rotate/patch.json")
		})
	}

	t.Run("runner-credentials", func(t *testing.T) {
		r := newOpsRun(t, bin, initialCluster(t))
		if err := os.WriteFile(filepath.Join(r.dir, "gdr-keys/registration-token"), []byte("token"), 0o600); err != nil {
			t.Fatal(err)
		}
		r.run("rotate runner-credentials register")
		r.run("rotate runner-credentials register")
		r.run("rotate runner-credentials pause")
		if got := r.load().ConfigMaps[opsNS+"gdr-config"]["GDR_PAUSED_POOLS"]; got != "*" {
			t.Fatalf("paused: GDR_PAUSED_POOLS %q", got)
		}
		r.run("rotate runner-credentials swap")
		if got := unb64(t, r.load().Secrets[opsNS+"gdr-runner-credentials"]["linux.json"]); !strings.Contains(got, `"id":2`) {
			t.Fatalf("swapped credentials %q, want the new registration", got)
		}
		mark := len(r.load().Log)
		r.run("rotate runner-credentials resume")
		if got := r.load().ConfigMaps[opsNS+"gdr-config"]["GDR_PAUSED_POOLS"]; got != "" {
			t.Fatalf("resumed: GDR_PAUSED_POOLS %q", got)
		}
		// The gateway on the new registrations before dispatch claims with them (an executor's
		// report of a new runner's task through a gateway on the old ones is refused).
		if !r.logged(mark, "rollout restart deployment/gateway", "rollout status deployment/gateway",
			"patch configmap gdr-config", "rollout restart deployment/dispatch", "rollout status deployment/dispatch") {
			t.Errorf("resume: %q", r.load().Log[mark:])
		}
		r.absent("gdr-keys/rotate/paused-pools", "gdr-keys/rotate/paused.pods")

		// The chart: the keys Job registers the pools of the emptied Secret.
		h := newOpsRun(t, bin, initialCluster(t))
		h.run("rotate runner-credentials pause")
		h.run("rotate runner-credentials swap-helm")
		h.run("rotate runner-credentials swap-helm")
		if got := unb64(t, h.load().Secrets[opsNS+"gdr-runner-credentials"]["linux.json"]); got == `{"id":1}` {
			t.Fatal("swap-helm kept the old registration")
		}
		if !strings.Contains(h.file("gdr-keys/rotate/runners/old-credentials.yaml"), b64(`{"id":1}`)) {
			t.Error("the old registration is not kept for its removal from Gitea")
		}
		h.run("rotate runner-credentials resume")
	})

	t.Run("nats-credentials", func(t *testing.T) {
		r := newOpsRun(t, bin, initialCluster(t))
		users := []string{"dispatch", "recover", "handle-setup", "handle-pod", "gateway"}
		seed := func(u string) string { return unb64(t, r.load().Secrets[opsNS+"gdr-nats-"+u]["nkey"]) }
		first := map[string]string{}
		for _, u := range users {
			first[u] = seed(u)
		}
		shipped := r.file("deploy/nats/authorization.conf")

		r.run("rotate nats-credentials add")
		r.run("rotate nats-credentials add")
		if got := r.file("gdr-keys/nats-authorization.conf"); got != withNextKeys(shipped) {
			t.Fatalf("the add's authorization file is not the shipped one with the next keys:\n%s", got)
		}
		env := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(r.file("gdr-keys/nats-users.env")), "\n") {
			k, v, _ := strings.Cut(line, "=")
			env[k] = v
		}
		if len(env) != 2*len(natsUsers) {
			t.Fatalf("the add's environment %q, want NKEY_<USER> and NKEY_<USER>_NEXT of every user", env)
		}
		// A real nats-server with those files takes the old and the new key of every user.
		url := runAuthorizedNATS(t, t.TempDir(), r.file("gdr-keys/nats-authorization.conf"), "", env)
		for _, u := range users {
			for _, s := range []string{first[u], r.file("gdr-keys/rotate/nats-" + u + ".nk")} {
				f := filepath.Join(t.TempDir(), "nk")
				if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				(authorizedNATS{url: url, seeds: map[string]string{u: f}}).connect(t, u)
			}
		}

		mark := len(r.load().Log)
		r.run("rotate nats-credentials reload")
		if got := r.load().ConfigMaps["nats/nats-users"]; len(got) != 2*len(natsUsers) {
			t.Errorf("reload: nats-users %q", got)
		}
		if !r.logged(mark, "-n nats rollout restart statefulset/nats") {
			t.Errorf("reload: %q", r.load().Log[mark:])
		}
		r.run("rotate nats-credentials swap")
		for _, u := range users {
			if seed(u) != r.file("gdr-keys/rotate/nats-"+u+".nk") {
				t.Errorf("gdr-nats-%s does not hold the new seed", u)
			}
		}
		if out, err := r.try("rotate nats-credentials add"); err == nil {
			t.Errorf("an add after the swap: %s", out)
		}
		r.finishJobs()
		r.run("rotate nats-credentials drop")
		r.run("rotate nats-credentials reload")
		if got := r.file("gdr-keys/nats-authorization.conf"); got != shipped {
			t.Error("after the drop, the authorization file is not the shipped one")
		}
		users2 := r.load().ConfigMaps["nats/nats-users"]
		if len(users2) != len(natsUsers) {
			t.Errorf("after the drop, nats-users %q", users2)
		}
		for _, u := range users {
			lines := strings.Split(strings.TrimSpace(seed(u)), "\n")
			if users2["NKEY_"+strings.ToUpper(strings.ReplaceAll(u, "-", "_"))] != lines[len(lines)-1] || r.file("gdr-keys/nats-"+u+".nk") != seed(u) {
				t.Errorf("after the drop, %s's public key or seed file is not the new key's", u)
			}
		}
		r.absent("gdr-keys/rotate/nats-credentials.pods", "gdr-keys/rotate/nats-dispatch.nk")
	})

	t.Run("ca", func(t *testing.T) {
		r := newOpsRun(t, bin, initialCluster(t))
		r.run("rotate ca swap")
		ca := unb64(t, r.load().Secrets[opsNS+"gdr-identity-ca"]["ca.pem"])
		r.run("rotate ca swap")
		s := r.load()
		if got := unb64(t, s.Secrets[opsNS+"gdr-identity-ca"]["ca.pem"]); got == "ROOT-0\n" || got != ca {
			t.Fatalf("after swap (twice) the CA is %q, want one new CA", got)
		}
		if b := s.ConfigMaps[opsNS+"gdr-identity-bundle"]["bundle.pem"]; b != "ROOT-0\n"+ca {
			t.Fatalf("after swap the bundle is %q, want both roots", b)
		}
		if unb64(t, s.Secrets[opsNS+"gdr-gateway-svid"]["issuer"]) != "ROOT-0\n" {
			t.Fatal("the swap replaced the gateway's certificate while executors of the old root run")
		}
		r.finishJobs()
		r.run("rotate ca drop")
		s = r.load()
		if b := s.ConfigMaps[opsNS+"gdr-identity-bundle"]["bundle.pem"]; b != ca {
			t.Fatalf("after drop the bundle is %q, want the new root alone", b)
		}
		if unb64(t, s.Secrets[opsNS+"gdr-gateway-svid"]["issuer"]) != ca {
			t.Fatal("after drop the gateway's certificate is not the new CA's")
		}
		r.absent("gdr-keys/rotate/ca.pods", "gdr-keys/rotate/ca.pem")
	})
}
