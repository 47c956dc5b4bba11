// Package webhook reads Gitea's workflow_job webhook deliveries, which tell
// dispatch that a job is waiting, and when jobs were created, picked and
// started their first step (metrics). A delivery is only a hint to poll: it
// can arrive late (after the task was claimed), twice, or not at all, so
// nothing depends on it but latency and those metrics.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Headers of a Gitea delivery.
const (
	HeaderEvent     = "X-Gitea-Event"
	HeaderSignature = "X-Gitea-Signature"
	// EventWorkflowJob is the X-Gitea-Event of a job delivery.
	EventWorkflowJob = "workflow_job"
	// ActionQueued is the action of a job that became waiting.
	ActionQueued = "queued"
	// ActionInProgress is the action of a job a runner picked (and again
	// of one being cancelled).
	ActionInProgress = "in_progress"
	// ActionCompleted is the action of a job that ended.
	ActionCompleted = "completed"
)

// ErrSignature means a delivery's signature is missing or wrong.
var ErrSignature = errors.New("webhook signature does not match")

// Verify checks, in constant time, that signature (X-Gitea-Signature: hex
// HMAC-SHA256 of the raw body) was made with secret.
func Verify(secret, body []byte, signature string) error {
	got, err := hex.DecodeString(signature)
	if err != nil || signature == "" {
		return ErrSignature
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return ErrSignature
	}
	return nil
}

// Sign returns the X-Gitea-Signature of body under secret.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// verify checks signature against Secret, then each of OldSecrets.
func (rc Receiver) verify(body []byte, signature string) error {
	err := Verify(rc.Secret, body, signature)
	for _, old := range rc.OldSecrets {
		if err == nil {
			break
		}
		err = Verify(old, body, signature)
	}
	return err
}

// Job is what dispatch uses of a workflow_job delivery. The times are
// Gitea's, to the second; a time Gitea has not set is the zero Time.
type Job struct {
	Action     string
	JobID      int64
	RunID      int64
	Labels     []string
	Repository string
	// Conclusion is the result of a completed job: success, failure,
	// cancelled, skipped.
	Conclusion string
	// CreatedAt is when Gitea created the job (the push, or the event
	// that triggered its run); StartedAt when a runner picked it (the
	// claim).
	CreatedAt, StartedAt time.Time
	// FirstStepAt is the earliest start of its steps, as its runner
	// reported them: zero while (or if) no step started.
	FirstStepAt time.Time
}

// Parse decodes a workflow_job delivery body.
func Parse(body []byte) (Job, error) {
	var p struct {
		Action      string `json:"action"`
		WorkflowJob *struct {
			ID         int64     `json:"id"`
			RunID      int64     `json:"run_id"`
			Labels     []string  `json:"labels"`
			Conclusion string    `json:"conclusion"`
			CreatedAt  time.Time `json:"created_at"`
			StartedAt  time.Time `json:"started_at"`
			Steps      []struct {
				StartedAt time.Time `json:"started_at"`
			} `json:"steps"`
		} `json:"workflow_job"`
		Repository struct {
			FullName string `json:"full_name"`
		} `json:"repository"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return Job{}, fmt.Errorf("workflow_job delivery is not JSON: %w", err)
	}
	if p.Action == "" || p.WorkflowJob == nil || p.WorkflowJob.ID == 0 {
		return Job{}, errors.New("workflow_job delivery has no action or job")
	}
	wj := p.WorkflowJob
	job := Job{Action: p.Action, JobID: wj.ID, RunID: wj.RunID, Labels: wj.Labels, Repository: p.Repository.FullName,
		Conclusion: wj.Conclusion, CreatedAt: set(wj.CreatedAt), StartedAt: set(wj.StartedAt)}
	for _, st := range wj.Steps {
		if at := set(st.StartedAt); !at.IsZero() && (job.FirstStepAt.IsZero() || at.Before(job.FirstStepAt)) {
			job.FirstStepAt = at
		}
	}
	return job, nil
}

// set is t, or the zero Time for a time Gitea has not set, which it sends
// as the Unix epoch (a zero timestamp) or omits.
func set(t time.Time) time.Time {
	if t.Unix() <= 0 {
		return time.Time{}
	}
	return t
}

// Dedup remembers the last Size (job, action) pairs it saw. Gitea repeats
// deliveries; a repeat needs no second poll.
type Dedup struct {
	Size int

	mu    sync.Mutex
	seen  map[dedupKey]bool
	order []dedupKey
}

type dedupKey struct {
	job    int64
	action string
}

// First reports whether (jobID, action) is new, and remembers it.
func (d *Dedup) First(jobID int64, action string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := dedupKey{jobID, action}
	if d.seen[k] {
		return false
	}
	if d.seen == nil {
		d.seen = map[dedupKey]bool{}
	}
	d.seen[k] = true
	d.order = append(d.order, k)
	if size := max(d.Size, 1); len(d.order) > size {
		delete(d.seen, d.order[0])
		d.order = d.order[1:]
	}
	return true
}

// MaxDelivery bounds a delivery's body; Gitea's are a few kilobytes. A
// larger one is refused with 413 before more than this is read.
const MaxDelivery = 1 << 20

// Receiver reads deliveries at an HTTP endpoint: it checks the signature
// (when Secret is set) and keeps only workflow_job deliveries of queued jobs
// seen for the first time; its Observer hears of every job delivery seen
// for the first time.
type Receiver struct {
	// Secret, when set, is the secret a delivery must be signed with, or
	// one of OldSecrets: Gitea signs with the one secret its webhook has,
	// and during a rotation that is the old or the new one. Unset, nothing
	// is checked, OldSecrets neither.
	Secret     []byte
	OldSecrets [][]byte
	Dedup      *Dedup
	// Observer, if set, hears of every job delivery seen for the first
	// time, whatever its action (metrics).
	Observer Observer
	// Log, if set, hears of refused deliveries.
	Log *slog.Logger
}

// Observer hears of job deliveries (dispatchmetrics.Jobs). Quick, safe for
// concurrent use.
type Observer interface {
	Delivered(job Job)
}

// Receive reads one delivery. With ok false it has answered already: 401 for
// a bad signature, 413 for a body over MaxDelivery, 400 for a body that is
// not a job delivery, 202 "ignored"
// for anything else that needs no poll. With ok true the caller has a queued
// job to act on, and answers.
func (rc Receiver) Receive(w http.ResponseWriter, r *http.Request) (job Job, ok bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxDelivery))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		http.Error(w, fmt.Sprintf("delivery over %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
		return Job{}, false
	case err != nil:
		http.Error(w, "read body", http.StatusBadRequest)
		return Job{}, false
	}
	if len(rc.Secret) > 0 {
		if err := rc.verify(body, r.Header.Get(HeaderSignature)); err != nil {
			if rc.Log != nil {
				rc.Log.Warn("webhook delivery refused", slog.String("reason", err.Error()), slog.String("remote", r.RemoteAddr))
			}
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return Job{}, false
		}
	}
	if r.Header.Get(HeaderEvent) != EventWorkflowJob {
		http.Error(w, "ignored: not a workflow_job delivery", http.StatusAccepted)
		return Job{}, false
	}
	if job, err = Parse(body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return Job{}, false
	}
	if !rc.Dedup.First(job.JobID, job.Action) {
		http.Error(w, "ignored: duplicate delivery", http.StatusAccepted)
		return Job{}, false
	}
	if rc.Observer != nil {
		rc.Observer.Delivered(job)
	}
	if job.Action != ActionQueued {
		http.Error(w, "ignored: action "+job.Action, http.StatusAccepted)
		return Job{}, false
	}
	return job, true
}

// ParseSecrets returns the secrets of a comma-separated list
// (GDR_WEBHOOK_OLD_SECRETS): each entry trimmed of white space, empty entries
// skipped. A secret holding a comma or starting or ending with a space cannot
// be listed.
func ParseSecrets(list string) [][]byte {
	var secrets [][]byte
	for _, field := range strings.Split(list, ",") {
		if field = strings.TrimSpace(field); field != "" {
			secrets = append(secrets, []byte(field))
		}
	}
	return secrets
}

// CheckOldSecrets reports old secrets listed (GDR_WEBHOOK_OLD_SECRETS) while
// the current one (GDR_WEBHOOK_SECRET) is empty: deliveries would then not be
// checked at all, whatever the list says. It names the variables, never a
// secret.
func CheckOldSecrets(current, old string) error {
	if current == "" && len(ParseSecrets(old)) > 0 {
		return errors.New("GDR_WEBHOOK_OLD_SECRETS is set but GDR_WEBHOOK_SECRET is empty: deliveries would not be checked at all; set the current secret too")
	}
	return nil
}
