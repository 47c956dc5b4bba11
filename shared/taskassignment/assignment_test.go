package taskassignment

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func sample(t testing.TB) Assignment {
	t.Helper()
	id, err := taskidentity.New(td, "Alice/Repo", "build", 42)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(BackendPod, Task{ID: 42, Pool: "linux", Image: "docker.io/library/golang:1.26"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestIDIsDeterministicAndALabelValue(t *testing.T) {
	longest := strings.Repeat("p", MaxPoolLength)
	for _, tc := range []struct {
		pool   string
		taskID int64
		want   string
	}{
		{"linux", 42, "linux-42"},
		{"a-1", 2, "a-1-2"},
		{longest, math.MaxInt64, longest + "-9223372036854775807"},
	} {
		got, err := ID(tc.pool, tc.taskID)
		if err != nil {
			t.Fatalf("ID(%q, %d): %v", tc.pool, tc.taskID, err)
		}
		again, _ := ID(tc.pool, tc.taskID)
		if got != tc.want || again != got {
			t.Fatalf("ID(%q, %d) = %q then %q, want %q", tc.pool, tc.taskID, got, again, tc.want)
		}
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Fatalf("ID %q is not a label value: %v", got, errs)
		}
	}
}

func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		id     string
		pool   string
		taskID int64
	}{
		{"linux-42", "linux", 42},
		{"a-1-2", "a-1", 2},
	} {
		pool, taskID, err := ParseID(tc.id)
		if err != nil || pool != tc.pool || taskID != tc.taskID {
			t.Errorf("ParseID(%q) = %q, %d, %v", tc.id, pool, taskID, err)
		}
	}
	for _, bad := range []string{"", "linux", "linux-", "-42", "linux-0", "linux-042", "Linux-42", "linux-x", "started.linux-42"} {
		if _, _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) succeeded", bad)
		}
	}
}

func TestIDRejects(t *testing.T) {
	for _, tc := range []struct {
		pool    string
		taskID  int64
		wantErr string
	}{
		{"", 1, "empty"},
		{strings.Repeat("p", MaxPoolLength+1), 1, "longer than"},
		{"Linux", 1, "lower-case"},
		{"-linux", 1, "lower-case"},
		{"linux-", 1, "lower-case"},
		{"lin_ux", 1, "lower-case"},
		{"linux", 0, "not positive"},
		{"linux", -3, "not positive"},
	} {
		if _, err := ID(tc.pool, tc.taskID); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ID(%q, %d) error = %v, want it to mention %q", tc.pool, tc.taskID, err, tc.wantErr)
		}
	}
}

func TestParseBackend(t *testing.T) {
	for _, b := range BackendKinds() {
		got, err := ParseBackendKind(string(b))
		if err != nil || got != b {
			t.Fatalf("ParseBackend(%q) = %q, %v", b, got, err)
		}
	}
	if _, err := ParseBackendKind("docker"); err == nil || !strings.Contains(err.Error(), `"docker"`) {
		t.Fatalf("ParseBackend(docker) error = %v", err)
	}
}

func TestWireRoundTrip(t *testing.T) {
	want := sample(t)
	data, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data, td)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(Encode(a)) = %+v, want %+v", got, want)
	}
}

// TestWireServices: a job's services travel in the signed message and come
// back as they went; a job without them encodes exactly as before services
// existed (no "services" member), so its bytes and signature are unchanged.
func TestWireServices(t *testing.T) {
	plain, err := Encode(sample(t))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain), "services") {
		t.Fatalf("a job without services encodes %s", plain)
	}
	want := sample(t)
	want.Task.Services = []jobservices.Service{
		{ID: "postgres", Image: "postgres:17", Env: map[string]string{"POSTGRES_PASSWORD": "postgres"}, Ports: []string{"5432"},
			Cmd: []string{"-c", "fsync=off"}, Options: "--health-cmd pg_isready", Credentials: true},
		{ID: "redis", Image: "redis:7"},
	}
	data, err := Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data, td)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(Encode(a)) = %+v, want %+v", got, want)
	}
	for _, tc := range []struct{ services, wantErr string }{
		{`[{"image":"redis:7"}]`, `missing field "task.services[0].id"`},
		{`[{"id":"redis"}]`, `missing field "task.services[0].image"`},
		{`[{"id":"redis","image":"r"},{"id":"postgres","image":"p"}]`, "want distinct IDs in order"},
		{`[{"id":"redis","image":"r"},{"id":"redis","image":"r"}]`, "want distinct IDs in order"},
		{`[{"id":"redis","image":"r","password":"x"}]`, `unknown field "password"`},
	} {
		msg := strings.Replace(string(plain), `"pool":"linux"`, `"pool":"linux","services":`+tc.services, 1)
		if _, err := Decode([]byte(msg), td); err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Decode(services %s) = %v, want %q", tc.services, err, tc.wantErr)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	const valid = `{"version":1,"id":"linux-42","backend":"pod","task":{"id":42,"pool":"linux"},` +
		`"identity":{"repository":"alice/repo","job":"build","spiffe_id":"spiffe://ci.example.org/repo/alice/repo/task/42"}}`
	if _, err := Decode([]byte(valid), td); err != nil {
		t.Fatalf("the valid message does not decode: %v", err)
	}
	for _, tc := range []struct {
		name, msg, wantErr string
	}{
		{"not JSON", `pod linux-42`, "not a JSON object"},
		{"JSON array", `[1]`, "not a JSON object"},
		{"no version", `{"id":"linux-42"}`, `missing field "version"`},
		{"future version", `{"version":2,"id":"linux-42"}`, "unsupported version 2"},
		{"missing id", strings.Replace(valid, `"id":"linux-42",`, ``, 1), `missing field "id"`},
		{"missing backend", strings.Replace(valid, `"backend":"pod",`, ``, 1), `missing field "backend"`},
		{"missing task id", strings.Replace(valid, `"id":42,`, ``, 1), `missing field "task.id"`},
		{"missing pool", strings.Replace(valid, `,"pool":"linux"`, ``, 1), `missing field "task.pool"`},
		{"missing repository", strings.Replace(valid, `"repository":"alice/repo",`, ``, 1), `missing field "identity.repository"`},
		{"missing job", strings.Replace(valid, `"job":"build",`, ``, 1), `missing field "identity.job"`},
		{"missing SPIFFE ID", strings.Replace(valid, `,"spiffe_id":"spiffe://ci.example.org/repo/alice/repo/task/42"`, ``, 1), `missing field "identity.spiffe_id"`},
		{"unknown field", strings.Replace(valid, `"version":1,`, `"version":1,"token":"x",`, 1), `unknown field "token"`},
		{"trailing data", valid + `{}`, "after top-level value"},
		{"unknown backend", strings.Replace(valid, `"pod"`, `"docker"`, 1), `unknown backend "docker"`},
		{"ID of another task", strings.Replace(valid, `"id":"linux-42"`, `"id":"linux-43"`, 1), "does not match pool"},
		{"task ID as string", strings.Replace(valid, `"id":42`, `"id":"42"`, 1), "cannot unmarshal"},
		{"other trust domain", strings.Replace(valid, "ci.example.org", "evil.example.org", 1), "outside trust domain"},
		{"identity of another task", strings.Replace(valid, "task/42", "task/41", 1), "does not match repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.msg), td)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Decode() error = %v, want it to mention %q", err, tc.wantErr)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode() error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	good, err := Encode(sample(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Decode(data, td)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Whatever decodes is valid and survives a round trip unchanged.
		if err := a.Validate(td); err != nil {
			t.Fatalf("decoded an invalid assignment %+v: %v", a, err)
		}
		again, err := Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Decode(again, td)
		if err != nil || !reflect.DeepEqual(b, a) {
			t.Fatalf("round trip of %+v gave %+v, %v", a, b, err)
		}
	})
}
