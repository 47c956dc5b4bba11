package bootstrap

import (
	"bytes"
	"encoding/base64"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
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

// key returns a capability key whose bytes all equal fill.
func key(fill byte) secretkey.Key { return secretkey.Key(bytes.Repeat([]byte{fill}, MinKeyLength)) }

// TestOldKeys: a bootstrap key rotation. A capability issued under a key verifies at a
// verifier whose current key or listed old key it is, and at no other; an issuer always signs
// with its current key. Both the verifier of the add phase (the new key listed as old, before
// handle and recover sign with it) and of the swap phase (the old key listed) accept every
// running executor's capability.
func TestOldKeys(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	a := assignment(t, 42)
	for _, tc := range []struct {
		name    string
		signed  byte   // the issuer's GDR_BOOTSTRAP_KEY
		current byte   // the verifier's GDR_BOOTSTRAP_KEY
		old     []byte // the verifier's GDR_BOOTSTRAP_OLD_KEYS
		ok      bool
	}{
		{"the current key", 1, 1, nil, true},
		{"the current key, old keys listed", 1, 1, []byte{2, 3}, true},
		{"the old key listed (swap)", 1, 2, []byte{1}, true},
		{"the old key listed second", 1, 2, []byte{3, 1}, true},
		{"the new key listed before the issuers sign with it (add)", 2, 1, []byte{2}, true},
		{"no old key", 1, 2, nil, false},
		{"the old key not listed (drop)", 1, 2, []byte{3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issuer, err := Settings{KeySettings: KeySettings{Key: key(tc.signed)}, GatewayURL: "https://gateway.example.org"}.New(td)
			if err != nil {
				t.Fatal(err)
			}
			env, err := issuer.Environment(a)
			if err != nil {
				t.Fatal(err)
			}
			ks := KeySettings{Key: key(tc.current)}
			for _, b := range tc.old {
				ks.OldKeys = append(ks.OldKeys, key(b))
			}
			v, err := ks.Verifier()
			if err != nil {
				t.Fatal(err)
			}
			err = v.Verify(a.ID, a.Task.ID, a.Identity.SPIFFEID, env[EnvCapability])
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadCapability)) {
				t.Fatalf("Verify() = %v, want ok=%v", err, tc.ok)
			}
			// Another assignment's capability stays refused whatever the keys.
			if err := v.Verify("linux-43", a.Task.ID, a.Identity.SPIFFEID, env[EnvCapability]); !errors.Is(err, ErrBadCapability) {
				t.Fatalf("Verify() of another assignment = %v", err)
			}
		})
	}

	// Issuing always uses the current key: an issuer with old keys signs what the current key
	// alone verifies, and an old key alone does not.
	both, err := Settings{KeySettings: KeySettings{Key: key(2), OldKeys: secretkey.Keys{key(1)}}, GatewayURL: "https://gateway.example.org"}.New(td)
	if err != nil {
		t.Fatal(err)
	}
	env, err := both.Environment(a)
	if err != nil {
		t.Fatal(err)
	}
	for fill, ok := range map[byte]bool{2: true, 1: false} {
		v, err := NewVerifier(key(fill))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Verify(a.ID, a.Task.ID, a.Identity.SPIFFEID, env[EnvCapability]); (err == nil) != ok {
			t.Errorf("the capability of an issuer with current key 2 and old key 1, verified with key %d alone: %v", fill, err)
		}
	}
}

// TestKeySettingsCheck: GDR_BOOTSTRAP_OLD_KEYS is checked key by key, by Settings (handle,
// recover) and KeySettings (the gateway) alike; errors name the variable and the key's
// position, never a key.
func TestKeySettingsCheck(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	short := secretkey.Key(bytes.Repeat([]byte{7}, MinKeyLength-1))
	for _, tc := range []struct {
		name    string
		ks      KeySettings
		wantErr string
	}{
		{"current only", KeySettings{Key: key(1)}, ""},
		{"old keys", KeySettings{Key: key(1), OldKeys: secretkey.Keys{key(2), append(key(3), 0)}}, ""},
		{"short current", KeySettings{Key: short}, "GDR_BOOTSTRAP_KEY: key has 31 bytes"},
		{"a short old key", KeySettings{Key: key(1), OldKeys: secretkey.Keys{key(2), short}}, "GDR_BOOTSTRAP_OLD_KEYS: key 2 has 31 bytes, need at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Settings{KeySettings: tc.ks, GatewayURL: "https://gateway.example.org"}
			for what, check := range map[string]func() error{
				"KeySettings.Check":      tc.ks.Check,
				"KeySettings.Verifier":   func() error { _, err := tc.ks.Verifier(); return err },
				"Settings.Check":         func() error { return s.Check(td) },
				"Settings.Check (no td)": func() error { return s.Check(spiffeid.TrustDomain{}) },
				"Settings.New":           func() error { _, err := s.New(td); return err },
			} {
				err := check()
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s = %v, want it to say %q", what, err, tc.wantErr)
				}
				for _, k := range append(tc.ks.OldKeys, tc.ks.Key) {
					if strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(k)) || strings.Contains(err.Error(), string(k)) {
						t.Fatalf("%s: the error shows a key: %v", what, err)
					}
				}
			}
		})
	}
}
