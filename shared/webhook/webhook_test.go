package webhook

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
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
