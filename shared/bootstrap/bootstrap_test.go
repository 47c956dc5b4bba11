package bootstrap

import (
	"bytes"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

func assignment(t *testing.T, taskID int64) taskassignment.Assignment {
	t.Helper()
	id, err := taskidentity.New(spiffeid.RequireTrustDomainFromString("ci.example.org"), "alice/repo", "build", taskID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := taskassignment.New(taskassignment.BackendProcess, taskassignment.Task{ID: taskID, Pool: "linux"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func newBootstrap(t *testing.T, fill byte) *Bootstrap {
	t.Helper()
	b, err := New(bytes.Repeat([]byte{fill}, MinKeyLength), "https://gateway.example.org:8443", spiffeid.RequireFromString("spiffe://ci.example.org/gateway"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNewRefuses(t *testing.T) {
	if _, err := New(bytes.Repeat([]byte{1}, MinKeyLength-1), "https://g.example.org", spiffeid.RequireFromString("spiffe://ci.example.org/gateway")); err == nil || !strings.Contains(err.Error(), "31 bytes") {
		t.Fatalf("a 31-byte key: err = %v", err)
	}
	for _, u := range []string{"", "gateway:8443", "ftp://g.example.org", "https://"} {
		if _, err := New(bytes.Repeat([]byte{1}, MinKeyLength), u, spiffeid.RequireFromString("spiffe://ci.example.org/gateway")); err == nil {
			t.Errorf("gateway URL %q accepted", u)
		}
	}
}

func TestEnvironmentIsDeterministic(t *testing.T) {
	a := assignment(t, 42)
	first, err := newBootstrap(t, 1).Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	second, err := newBootstrap(t, 1).Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(first, second) {
		t.Fatalf("two Bootstraps with one key disagree:\n%v\n%v", first, second)
	}
	if len(first) != len(Variables()) {
		t.Fatalf("environment has %d variables, Variables() lists %d", len(first), len(Variables()))
	}
	other, _ := newBootstrap(t, 2).Environment(a)
	if other[EnvCapability] == first[EnvCapability] {
		t.Fatal("another key gives the same capability")
	}
	next, _ := newBootstrap(t, 1).Environment(assignment(t, 43))
	if next[EnvCapability] == first[EnvCapability] {
		t.Fatal("another task gives the same capability")
	}
}

func TestVerify(t *testing.T) {
	b := newBootstrap(t, 1)
	a := assignment(t, 42)
	capability := b.Capability(a.ID, a.Task.ID, a.Identity.SPIFFEID)
	tests := []struct {
		name         string
		assignmentID string
		taskID       int64
		spiffeID     string
		capability   string
		ok           bool
	}{
		{"own", a.ID, 42, a.Identity.SPIFFEID, capability, true},
		{"another assignment", "linux-43", 42, a.Identity.SPIFFEID, capability, false},
		{"another task", a.ID, 43, a.Identity.SPIFFEID, capability, false},
		{"another SPIFFE ID", a.ID, 42, "spiffe://ci.example.org/repo/alice/repo/task/43", capability, false},
		{"empty", a.ID, 42, a.Identity.SPIFFEID, "", false},
		{"truncated", a.ID, 42, a.Identity.SPIFFEID, capability[:len(capability)-1], false},
		{"forged", a.ID, 42, a.Identity.SPIFFEID, newBootstrap(t, 2).Capability(a.ID, 42, a.Identity.SPIFFEID), false},
		// Field boundaries are length-prefixed: shifting text between fields changes the MAC.
		{"shifted boundary", a.ID + "4", 2, a.Identity.SPIFFEID, b.Capability(a.ID, 42, a.Identity.SPIFFEID), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := b.Verify(tt.assignmentID, tt.taskID, tt.spiffeID, tt.capability)
			if (err == nil) != tt.ok {
				t.Fatalf("Verify() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrBadCapability) {
				t.Fatalf("Verify() error %v is not ErrBadCapability", err)
			}
		})
	}
}

func TestReadRoundTrip(t *testing.T) {
	a := assignment(t, 42)
	env, err := newBootstrap(t, 1).Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := Values{AssignmentID: a.ID, TaskID: 42, SPIFFEID: a.Identity.SPIFFEID, Capability: env[EnvCapability],
		GatewayURL: "https://gateway.example.org:8443", GatewayID: spiffeid.RequireFromString("spiffe://ci.example.org/gateway")}
	if got != want {
		t.Fatalf("Read() = %+v, want %+v", got, want)
	}
	for _, name := range Variables() {
		partial := maps.Clone(env)
		delete(partial, name)
		if _, err := Read(func(k string) string { return partial[k] }); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("without %s: err = %v", name, err)
		}
	}
	bad := maps.Clone(env)
	bad[EnvTaskID] = "x"
	_, err = Read(func(k string) string { return bad[k] })
	if err == nil || strings.Contains(err.Error(), env[EnvCapability]) {
		t.Fatalf("bad task ID: err = %v", err)
	}
}

func TestVerifierOnlyVerifies(t *testing.T) {
	a := assignment(t, 42)
	issuer := newBootstrap(t, 1)
	v, err := NewVerifier(bytes.Repeat([]byte{1}, MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(a.ID, 42, a.Identity.SPIFFEID, issuer.Capability(a.ID, 42, a.Identity.SPIFFEID)); err != nil {
		t.Fatalf("the verifier refused the issuer's capability: %v", err)
	}
	if _, err := v.Environment(a); err == nil {
		t.Fatal("a verifier issued an environment")
	}
	if _, err := NewVerifier(make([]byte, 8)); err == nil {
		t.Fatal("a short key was accepted")
	}
}

func TestGatewayMustBeHTTPSAndNamed(t *testing.T) {
	key := bytes.Repeat([]byte{1}, MinKeyLength)
	gw := spiffeid.RequireFromString("spiffe://ci.example.org/gateway")
	for _, url := range []string{"http://gateway.example.org", "gateway.example.org:443", "https://"} {
		if _, err := New(key, url, gw); err == nil || !strings.Contains(err.Error(), "https") {
			t.Errorf("New(%q) = %v, want an https error", url, err)
		}
	}
	if _, err := New(key, "https://gateway.example.org", spiffeid.ID{}); err == nil {
		t.Error("New without a gateway ID succeeded")
	}
	env, err := newBootstrap(t, 1).Environment(assignment(t, 5))
	if err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string]string{EnvGatewayURL: "http://gateway.example.org", EnvGatewayID: "not a SPIFFE ID"} {
		bad := maps.Clone(env)
		bad[name] = value
		if _, err := Read(func(k string) string { return bad[k] }); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Read with %s=%q: %v", name, value, err)
		}
	}
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	for _, tc := range []struct{ configured, want string }{
		{"", "spiffe://ci.example.org/gateway"},
		{"spiffe://ci.example.org/ns/gdr/sa/gateway", "spiffe://ci.example.org/ns/gdr/sa/gateway"},
		{"spiffe://evil.example.org/gateway", ""},
		{"gateway", ""},
	} {
		id, err := GatewayID(td, tc.configured)
		if (tc.want == "") != (err != nil) || (err == nil && id.String() != tc.want) {
			t.Errorf("GatewayID(%q) = %v, %v; want %q", tc.configured, id, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "GDR_GATEWAY_SPIFFE_ID") {
			t.Errorf("GatewayID(%q) error %v does not name the variable", tc.configured, err)
		}
	}
}
