package giteaenv

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

var apiClient = &http.Client{Timeout: 30 * time.Second}

// raw sends one request to URL+path (path without a leading slash), with the admin token once
// there is one, and returns the status and body.
func (s *Server) raw(method, path string, body []byte, contentType string) (int, []byte, error) {
	req, err := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if s.AdminToken != "" {
		req.Header.Set("Authorization", "token "+s.AdminToken)
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Do calls the REST API as the admin: path is below /api/v1 (e.g. "/repos/o/r/actions/runs"),
// in is sent as JSON unless nil, and a 2xx JSON answer is decoded into out unless nil. It returns
// the status; a transport error or an undecodable 2xx answer fails the test.
func (s *Server) Do(t testing.TB, method, path string, in, out any) int {
	t.Helper()
	code, _ := s.do(t, method, path, in, out)
	return code
}

func (s *Server) do(t testing.TB, method, path string, in, out any) (int, []byte) {
	t.Helper()
	var body []byte
	ct := ""
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			t.Fatal(err)
		}
		ct = "application/json"
	}
	code, b, err := s.raw(method, "api/v1"+path, body, ct)
	if err != nil {
		t.Fatalf("giteaenv: %s %s: %v", method, path, err)
	}
	if out != nil && code/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("giteaenv: %s %s: decode %q: %v", method, path, b, err)
		}
	}
	return code, b
}

// must is do that fails the test unless the status is one of want.
func (s *Server) must(t testing.TB, method, path string, in, out any, want ...int) int {
	t.Helper()
	code, b := s.do(t, method, path, in, out)
	if !slices.Contains(want, code) {
		t.Fatalf("giteaenv: %s /api/v1%s: status %d, want %v: %s", method, path, code, want, b)
	}
	return code
}

// CreateRepo creates a repository of the admin with an initial commit on "main" and returns
// "owner/name".
func (s *Server) CreateRepo(t testing.TB, name string) string {
	t.Helper()
	var r struct {
		FullName string `json:"full_name"`
	}
	s.must(t, http.MethodPost, "/user/repos",
		map[string]any{"name": name, "auto_init": true, "default_branch": "main"}, &r, http.StatusCreated)
	return r.FullName
}

// RegistrationToken returns the instance-wide runner registration token (reusable; the same
// value until reset).
func (s *Server) RegistrationToken(t testing.TB) string {
	t.Helper()
	var r struct {
		Token string `json:"token"`
	}
	s.must(t, http.MethodPost, "/admin/actions/runners/registration-token", nil, &r, http.StatusOK, http.StatusCreated)
	if r.Token == "" {
		t.Fatal("giteaenv: empty registration token")
	}
	return r.Token
}

// PushWorkflow creates or updates the file path (e.g. ".gitea/workflows/ci.yml") on "main" of
// repo ("owner/name") with a commit by the admin, which fires a push event, and returns that
// commit's SHA (the task context's sha).
func (s *Server) PushWorkflow(t testing.TB, repo, path, yaml string) string {
	t.Helper()
	p := "/repos/" + repo + "/contents/" + strings.TrimPrefix(path, "/")
	var cur struct {
		SHA string `json:"sha"`
	}
	s.must(t, http.MethodGet, p+"?ref=main", nil, &cur, http.StatusOK, http.StatusNotFound)
	var r struct {
		Commit struct {
			SHA string `json:"sha"`
		} `json:"commit"`
	}
	s.must(t, http.MethodPut, p, map[string]string{
		"content": base64.StdEncoding.EncodeToString([]byte(yaml)),
		"message": "update " + path,
		"branch":  "main",
		"sha":     cur.SHA, // empty: create
	}, &r, http.StatusOK, http.StatusCreated)
	return r.Commit.SHA
}

// PushFiles creates or updates the files (path: content) on "main" of repo in one commit by
// the admin, which fires one push event, and returns that commit's SHA. Gitea detects a push's
// workflows at the branch's head when it handles the event, so files pushed one commit each
// (PushWorkflow) can start a workflow twice: once for its own commit, once for an earlier
// commit's event handled after it.
func (s *Server) PushFiles(t testing.TB, repo string, files map[string]string) string {
	t.Helper()
	type change struct {
		Operation string `json:"operation"`
		Path      string `json:"path"`
		Content   string `json:"content"`
		SHA       string `json:"sha,omitempty"`
	}
	var changes []change
	for _, path := range slices.Sorted(maps.Keys(files)) {
		var cur struct {
			SHA string `json:"sha"`
		}
		c := change{Operation: "create", Path: path, Content: base64.StdEncoding.EncodeToString([]byte(files[path]))}
		if s.must(t, http.MethodGet, "/repos/"+repo+"/contents/"+path+"?ref=main", nil, &cur, http.StatusOK, http.StatusNotFound) == http.StatusOK {
			c.Operation, c.SHA = "update", cur.SHA
		}
		changes = append(changes, c)
	}
	var r struct {
		Commit struct {
			SHA string `json:"sha"`
		} `json:"commit"`
	}
	s.must(t, http.MethodPost, "/repos/"+repo+"/contents", map[string]any{
		"branch": "main", "message": "update " + strings.Join(slices.Sorted(maps.Keys(files)), ", "), "files": changes,
	}, &r, http.StatusCreated)
	return r.Commit.SHA
}

// SetSecret creates or replaces a repository Actions secret.
func (s *Server) SetSecret(t testing.TB, repo, name, value string) {
	t.Helper()
	s.must(t, http.MethodPut, "/repos/"+repo+"/actions/secrets/"+url.PathEscape(name),
		map[string]string{"data": value}, nil, http.StatusCreated, http.StatusNoContent)
}

// SetVariable creates or replaces a repository Actions variable.
func (s *Server) SetVariable(t testing.TB, repo, name, value string) {
	t.Helper()
	p := "/repos/" + repo + "/actions/variables/" + url.PathEscape(name)
	if s.must(t, http.MethodPost, p, map[string]string{"value": value}, nil,
		http.StatusCreated, http.StatusNoContent, http.StatusConflict) == http.StatusConflict {
		s.must(t, http.MethodPut, p, map[string]string{"name": name, "value": value}, nil,
			http.StatusOK, http.StatusCreated, http.StatusNoContent)
	}
}

// Job is one workflow job as the REST API shows it.
type Job struct {
	ID    int64  `json:"id"`     // the job id (webhook workflow_job.id; JobLogs); not a task id
	RunID int64  `json:"run_id"` // the run id (task context run_id; CancelRun)
	Name  string `json:"name"`
	// Status is "queued" (waiting for a runner), "waiting" (blocked on needs/concurrency),
	// "in_progress" (claimed by a runner, also while cancelling) or "completed".
	Status     string   `json:"status"`
	Conclusion string   `json:"conclusion"` // when completed: success, failure, cancelled, skipped
	Labels     []string `json:"labels"`     // runs-on
	RunAttempt int64    `json:"run_attempt"`
	HeadSHA    string   `json:"head_sha"`
	RunnerID   int64    `json:"runner_id"` // once claimed
	RunnerName string   `json:"runner_name"`
	Steps      []Step   `json:"steps"`
	// StartedAt is when a runner claimed it (its task was created); zero
	// while it waits.
	StartedAt time.Time `json:"started_at"`
}

// Step is one step of a claimed job.
type Step struct {
	Number     int64  `json:"number"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	Conclusion string `json:"conclusion"`
}

// Jobs returns every job of every run of repo, oldest first.
func (s *Server) Jobs(t testing.TB, repo string) []Job {
	t.Helper()
	var all []Job
	for page := 1; ; page++ {
		var r struct {
			Jobs       []Job `json:"jobs"`
			TotalCount int   `json:"total_count"`
		}
		s.must(t, http.MethodGet, fmt.Sprintf("/repos/%s/actions/jobs?page=%d&limit=50", repo, page), nil, &r, http.StatusOK)
		all = append(all, r.Jobs...)
		if len(r.Jobs) == 0 || len(all) >= r.TotalCount {
			return all
		}
	}
}

// WaitJob polls Jobs every 100 ms until one satisfies pred and returns the first (oldest) such
// job; it fails the test after timeout, listing the jobs it last saw.
func (s *Server) WaitJob(t testing.TB, repo string, pred func(Job) bool, timeout time.Duration) Job {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		jobs := s.Jobs(t, repo)
		for _, j := range jobs {
			if pred(j) {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("giteaenv: no matching job in %s after %v; jobs: %+v", repo, timeout, jobs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// JobLogs returns the job's log as Gitea serves it (one line per row, each prefixed with the
// row's RFC 3339 time). Fails the test if the job has no log (not yet claimed).
func (s *Server) JobLogs(t testing.TB, repo string, jobID int64) string {
	t.Helper()
	logs, ok := s.JobLogsIfAny(t, repo, jobID)
	if !ok {
		t.Fatalf("giteaenv: job %d of %s has no log", jobID, repo)
	}
	return logs
}

// JobLogsIfAny is JobLogs for a job that may have no log (never claimed, or
// claimed by a runner that never wrote one): false then (Gitea's 404). Any
// other answer but 200 fails the test.
func (s *Server) JobLogsIfAny(t testing.TB, repo string, jobID int64) (string, bool) {
	t.Helper()
	p := fmt.Sprintf("/repos/%s/actions/jobs/%d/logs", repo, jobID)
	code, b := s.do(t, http.MethodGet, p, nil, nil)
	switch code {
	case http.StatusOK:
		return string(b), true
	case http.StatusNotFound:
		return "", false
	}
	t.Fatalf("giteaenv: GET /api/v1%s: status %d: %s", p, code, b)
	return "", false
}

// CancelRun cancels every unfinished job of a run as the admin would in the UI. runID is
// Job.RunID (= the task context's run_id). A job whose task was claimed by a runner that
// declared "cancelling" becomes cancelling (shown as in_progress); otherwise cancelled at once.
func (s *Server) CancelRun(t testing.TB, repo string, runID int64) {
	t.Helper()
	web := s.webClient(t)
	resp, err := web.PostForm(fmt.Sprintf("%s%s/actions/runs/%d/cancel", s.URL, repo, runID), nil)
	if err != nil {
		t.Fatalf("giteaenv: cancel run %d: %v", runID, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("giteaenv: cancel run %d: status %d: %s", runID, resp.StatusCode, b)
	}
}

// webClient returns a client holding the admin's web session cookie (no CSRF token is needed
// when a request carries no Origin or Sec-Fetch-Site header).
func (s *Server) webClient(t testing.TB) *http.Client {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.web != nil {
		return s.web
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{
		Jar:           jar,
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := c.PostForm(s.URL+"user/login", url.Values{"user_name": {s.AdminUser}, "password": {s.AdminPassword}})
	if err != nil {
		t.Fatalf("giteaenv: web login: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(resp.Header.Get("Location"), "login") {
		t.Fatalf("giteaenv: web login: status %d, location %q: %.300s", resp.StatusCode, resp.Header.Get("Location"), b)
	}
	s.web = c
	return c
}

// AddSystemWebhook registers a system webhook (every repository) delivering workflow_job events
// as JSON to url, signed with secret (X-Gitea-Signature: hex HMAC-SHA256 of the body), and
// returns its id. Deliveries are queued: they lag the event and can repeat.
func (s *Server) AddSystemWebhook(t testing.TB, url, secret string) int64 {
	t.Helper()
	var r struct {
		ID int64 `json:"id"`
	}
	s.must(t, http.MethodPost, "/admin/hooks", map[string]any{
		"type":   "gitea",
		"active": true,
		"events": []string{"workflow_job"},
		"config": map[string]string{
			"url": url, "content_type": "json", "secret": secret, "is_system_webhook": "true",
		},
	}, &r, http.StatusCreated)
	return r.ID
}

// SetSystemWebhookSecret changes the secret the system webhook id (AddSystemWebhook's, delivering
// to url) signs with, as an administrator does when rotating it.
func (s *Server) SetSystemWebhookSecret(t testing.TB, id int64, url, secret string) {
	t.Helper()
	s.must(t, http.MethodPatch, fmt.Sprintf("/admin/hooks/%d", id), map[string]any{
		"config": map[string]string{"url": url, "content_type": "json", "secret": secret, "is_system_webhook": "true"},
	}, nil, http.StatusOK)
}

// CreateToken creates an access token of the admin named name with exactly scopes (Gitea's
// names, e.g. "read:admin") and returns it. Gitea makes tokens only for a password login, so
// this one call authenticates with the admin's password, not its token.
func (s *Server) CreateToken(t testing.TB, name string, scopes ...string) string {
	t.Helper()
	body, err := json.Marshal(map[string]any{"name": name, "scopes": scopes})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.URL+"api/v1/users/"+url.PathEscape(s.AdminUser)+"/tokens", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth(s.AdminUser, s.AdminPassword)
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatalf("giteaenv: create token %s: %v", name, err)
	}
	defer resp.Body.Close()
	var r struct {
		SHA1 string `json:"sha1"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &r) != nil || r.SHA1 == "" {
		t.Fatalf("giteaenv: create token %s: status %d: %s", name, resp.StatusCode, b)
	}
	return r.SHA1
}
