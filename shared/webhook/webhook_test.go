package webhook

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

const delivery = `{"action":"queued","workflow_job":{"id":17,"run_id":5,"name":"build","labels":["ubuntu-latest"],"status":"queued"},"repository":{"full_name":"alice/repo"}}`

func TestVerify(t *testing.T) {
	secret := []byte("hook-secret")
	body := []byte(delivery)
	good := Sign(secret, body)
	for _, tc := range []struct {
		name      string
		secret    []byte
		body      []byte
		signature string
		ok        bool
	}{
		{"good", secret, body, good, true},
		{"other secret", []byte("other"), body, good, false},
		{"altered body", secret, append([]byte(delivery), ' '), good, false},
		{"missing", secret, body, "", false},
		{"not hex", secret, body, "zz" + good[2:], false},
		{"truncated", secret, body, good[:len(good)-2], false},
	} {
		err := Verify(tc.secret, tc.body, tc.signature)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrSignature)) {
			t.Errorf("%s: Verify() = %v", tc.name, err)
		}
	}
}

func TestParse(t *testing.T) {
	j, err := Parse([]byte(delivery))
	if err != nil {
		t.Fatal(err)
	}
	if j.Action != "queued" || j.JobID != 17 || j.RunID != 5 || !slices.Equal(j.Labels, []string{"ubuntu-latest"}) || j.Repository != "alice/repo" {
		t.Fatalf("Parse() = %+v", j)
	}
	for _, bad := range []string{`{`, `{"action":"queued"}`, `{"workflow_job":{"id":1}}`, `[]`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
}

// The times of a delivery as Gitea 1.27.3 sends them: a time not set yet
// is the Unix epoch, and the first step is the earliest started one, in
// whatever order the steps come.
func TestParseTimes(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const (
		created = "2026-12-03T10:00:00Z"
		picked  = "2026-12-03T10:00:04Z"
		epoch   = "1970-01-01T00:00:00Z"
	)
	for _, tc := range []struct {
		name                    string
		job                     string
		created, started, first time.Time
		conclusion              string
	}{
		{"queued: nothing started", `"created_at":"` + created + `","started_at":"` + epoch + `","steps":[{"started_at":"` + epoch + `"}]`,
			at(created), time.Time{}, time.Time{}, ""},
		{"picked, no step yet", `"created_at":"` + created + `","started_at":"` + picked + `","steps":[{"started_at":"` + epoch + `"}]`,
			at(created), at(picked), time.Time{}, ""},
		{"completed: the earliest step", `"conclusion":"failure","created_at":"` + created + `","started_at":"` + picked +
			`","steps":[{"started_at":"2026-12-03T10:00:09Z"},{"started_at":"2026-12-03T10:00:07Z"},{"started_at":"` + epoch + `"}]`,
			at(created), at(picked), at("2026-12-03T10:00:07Z"), "failure"},
		{"completed before it ran", `"conclusion":"cancelled","created_at":"` + created + `","started_at":"` + epoch + `","steps":[]`,
			at(created), time.Time{}, time.Time{}, "cancelled"},
		{"no times at all", `"steps":null`, time.Time{}, time.Time{}, time.Time{}, ""},
	} {
		j, err := Parse([]byte(`{"action":"completed","workflow_job":{"id":3,` + tc.job + `}}`))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !j.CreatedAt.Equal(tc.created) || !j.StartedAt.Equal(tc.started) || !j.FirstStepAt.Equal(tc.first) || j.Conclusion != tc.conclusion {
			t.Errorf("%s: Parse() = created %v, started %v, first step %v, conclusion %q; want %v, %v, %v, %q", tc.name,
				j.CreatedAt, j.StartedAt, j.FirstStepAt, j.Conclusion, tc.created, tc.started, tc.first, tc.conclusion)
		}
	}
}

type observed []Job

func (o *observed) Delivered(j Job) { *o = append(*o, j) }

// The Observer hears of every job delivery the first time, whatever its
// action, and of no repeat; only a queued one goes on to the caller.
func TestReceiveObserves(t *testing.T) {
	var seen observed
	rc := Receiver{Secret: []byte("s"), Dedup: &Dedup{Size: 8}, Observer: &seen}
	for _, tc := range []struct {
		action string
		job    int
		ok     bool
		status int
	}{
		{ActionQueued, 1, true, 0},
		{ActionInProgress, 1, false, http.StatusAccepted},
		{ActionInProgress, 1, false, http.StatusAccepted}, // cancelling starts: a repeat
		{ActionCompleted, 1, false, http.StatusAccepted},
		{ActionCompleted, 1, false, http.StatusAccepted}, // a retried final report
		{ActionQueued, 1, false, http.StatusAccepted},
	} {
		body := fmt.Sprintf(`{"action":%q,"workflow_job":{"id":%d}}`, tc.action, tc.job)
		req := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
		req.Header.Set(HeaderEvent, EventWorkflowJob)
		req.Header.Set(HeaderSignature, Sign([]byte("s"), []byte(body)))
		w := httptest.NewRecorder()
		if _, ok := rc.Receive(w, req); ok != tc.ok || (!ok && w.Code != tc.status) {
			t.Errorf("%s of job %d: ok %v, status %d; want %v, %d", tc.action, tc.job, ok, w.Code, tc.ok, tc.status)
		}
	}
	var actions []string
	for _, j := range seen {
		actions = append(actions, j.Action)
	}
	if want := []string{ActionQueued, ActionInProgress, ActionCompleted}; !slices.Equal(actions, want) {
		t.Errorf("observed %v, want %v", actions, want)
	}
}

func TestDedup(t *testing.T) {
	d := &Dedup{Size: 2}
	steps := []struct {
		job    int64
		action string
		want   bool
	}{
		{1, "queued", true}, {1, "queued", false}, {1, "completed", true},
		{2, "queued", true}, // evicts (1, queued)
		{1, "queued", true}, {2, "queued", false},
	}
	for i, s := range steps {
		if got := d.First(s.job, s.action); got != s.want {
			t.Fatalf("step %d: First(%d, %s) = %v", i, s.job, s.action, got)
		}
	}
}

// A delivery over MaxDelivery is refused as too large, whatever its
// signature, before more than the cap is read: not a truncated body that
// then fails the signature check with 401.
func TestReceiveRefusesALargeDelivery(t *testing.T) {
	rc := Receiver{Secret: []byte("s"), Dedup: &Dedup{Size: 8}}
	for _, tc := range []struct {
		size int
		want int
	}{
		{MaxDelivery + 1, http.StatusRequestEntityTooLarge},
		{2 << 20, http.StatusRequestEntityTooLarge},
		{100, http.StatusUnauthorized}, // small and unsigned: the signature decides
	} {
		body := &countingReader{r: strings.NewReader(strings.Repeat("x", tc.size))}
		req := httptest.NewRequest(http.MethodPost, "/webhook", body)
		req.Header.Set(HeaderEvent, EventWorkflowJob)
		w := httptest.NewRecorder()
		if _, ok := rc.Receive(w, req); ok || w.Code != tc.want {
			t.Errorf("delivery of %d bytes: ok %v, status %d; want %d", tc.size, ok, w.Code, tc.want)
		}
		if body.n > MaxDelivery+1 {
			t.Errorf("delivery of %d bytes: read %d, more than the cap", tc.size, body.n)
		}
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestReceiveOldSecrets: a webhook secret rotation. Gitea signs each delivery with the one
// secret its webhook has; a Receiver takes a delivery signed with its Secret or any of its
// OldSecrets, so that deliveries signed before and after the webhook's secret changes are both
// taken, and refuses any other signature.
func TestReceiveOldSecrets(t *testing.T) {
	for _, tc := range []struct {
		name     string
		secret   string
		old      [][]byte
		signedBy string // "": unsigned
		ok       bool
	}{
		{"the current secret", "new", nil, "new", true},
		{"the current secret, old ones listed", "new", [][]byte{[]byte("old")}, "new", true},
		{"an old secret listed (Gitea not changed yet)", "new", [][]byte{[]byte("old")}, "old", true},
		{"an old secret listed second", "new", [][]byte{[]byte("older"), []byte("old")}, "old", true},
		{"the new secret listed before dispatch uses it", "old", [][]byte{[]byte("new")}, "new", true},
		{"no old secret", "new", nil, "old", false},
		{"another old secret listed", "new", [][]byte{[]byte("older")}, "old", false},
		{"unsigned", "new", [][]byte{[]byte("old")}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := Receiver{Secret: []byte(tc.secret), OldSecrets: tc.old, Dedup: &Dedup{Size: 8}}
			req := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(delivery))
			req.Header.Set(HeaderEvent, EventWorkflowJob)
			if tc.signedBy != "" {
				req.Header.Set(HeaderSignature, Sign([]byte(tc.signedBy), []byte(delivery)))
			}
			w := httptest.NewRecorder()
			job, ok := rc.Receive(w, req)
			if ok != tc.ok || (ok && job.JobID != 17) || (!ok && w.Code != http.StatusUnauthorized) {
				t.Fatalf("Receive = %+v, %v (status %d); want ok=%v", job, ok, w.Code, tc.ok)
			}
		})
	}
}

// TestSecretsSettings: GDR_WEBHOOK_OLD_SECRETS is a comma-separated list, entries trimmed and
// empty ones skipped; listing old secrets without a current one (deliveries then go unchecked)
// is an error naming both variables and no secret.
func TestSecretsSettings(t *testing.T) {
	if got := ParseSecrets(" old-1 ,,\nold-2,"); len(got) != 2 || string(got[0]) != "old-1" || string(got[1]) != "old-2" {
		t.Fatalf("ParseSecrets = %q", got)
	}
	if got := ParseSecrets(" , "); len(got) != 0 {
		t.Fatalf("ParseSecrets of blanks = %q", got)
	}
	for _, tc := range []struct {
		current, old string
		wantErr      bool
	}{
		{"", "", false},
		{"s3cret-now", "", false},
		{"s3cret-now", "s3cret-then", false},
		{"", " , ", false},
		{"", "s3cret-then", true},
	} {
		err := CheckOldSecrets(tc.current, tc.old)
		if (err != nil) != tc.wantErr {
			t.Fatalf("CheckOldSecrets(%q, %q) = %v, want an error: %v", tc.current, tc.old, err, tc.wantErr)
		}
		if err != nil && (!strings.Contains(err.Error(), "GDR_WEBHOOK_OLD_SECRETS") || !strings.Contains(err.Error(), "GDR_WEBHOOK_SECRET") || strings.Contains(err.Error(), "s3cret")) {
			t.Fatalf("CheckOldSecrets: %v", err)
		}
	}
}
