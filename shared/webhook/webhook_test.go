package webhook

import (
	"errors"
	"slices"
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
