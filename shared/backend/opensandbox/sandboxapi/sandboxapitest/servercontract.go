package sandboxapitest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// Target is a lifecycle server RunContract checks: this fake, or a real
// OpenSandbox server of Runtime with its default maximum timeout (86400 s)
// and an API key.
type Target struct {
	// Runtime is the server's runtime, which decides the answers the cases
	// expect: Docker (the zero value) or Kubernetes (provider batchsandbox).
	Runtime Runtime
	// URL is the server's base URL (the API is under URL + "/v1").
	URL string
	// APIKey is the key the server requires; it must not be empty.
	APIKey string
	// Image is the image URI of the sandboxes the cases create. Their
	// entrypoints are /bin/sh -c "sleep 3600" or "sleep 2; exit N". On
	// Kubernetes the node must hold it (the server's pull policy is
	// IfNotPresent in our harness) and have room for seven sandboxes of
	// 100m CPU and 64Mi at once.
	Image string
	// Exit, if not nil, makes the entrypoint of sandbox id exit with code
	// (the fake's Exit); nil for a real server, whose entrypoint exits by
	// itself two seconds after it started.
	Exit func(id string, code int)
	// Expire, if not nil, expires sandbox id now (the fake's Expire); nil
	// for a real server, where the case waits for its 60 s timeout.
	Expire func(id string)
	// Wait bounds how long a case waits, past the moment an exit or an
	// expiry is due, for the server to show it: a second or two for the
	// fake, a minute for a real server.
	Wait time.Duration
}

// The contract: the answers of the real server of each runtime, as recorded
// in docs/OPENSANDBOX.md ("What the real server answered", Docker) and
// docs/OPENSANDBOX-KUBERNETES.md (Kubernetes). Every case holds for the
// fake (New's defaults, WithAPIKey, and WithRuntime for Kubernetes) and for
// the real server of the same runtime alike; a case that fails against one
// of them is a drift of that one from the other.

// contractCase is one request and the answer the server must give to it.
type contractCase struct {
	// name names the subtest and is the value of the case's metadata
	// (gdr-contract-case), so a label value.
	name string
	// setup, if not nil, is a sandbox created before the request; its
	// create must answer contractCreated of the runtime.
	setup *contractSandbox
	// event happens to the setup's sandbox before the request.
	event contractEvent
	// method, path and body are the request. In path and body, {id} is the
	// setup's sandbox, {filter} the case's metadata as a list filter; a
	// body is made by contractCreate.
	method, path, body string
	// noKey leaves the API key out.
	noKey bool
	// want is the answer; {id} in its messages is the sandbox's ID.
	want contractAnswer
	// listed is how many sandboxes List by the case's metadata finds after
	// the answer, each the sandbox of the case in want's state.
	listed int
}

// contractSandbox is a sandbox a case creates first.
type contractSandbox struct {
	// exits makes the entrypoint exit with code two seconds after it
	// started; otherwise it runs for an hour.
	exits bool
	code  int
	// timeout is the create's timeout in seconds.
	timeout int
}

func (s contractSandbox) command() string {
	if s.exits {
		return fmt.Sprintf("sleep 2; exit %d", s.code)
	}
	return "sleep 3600"
}

// contractEvent is what happens to a case's sandbox before its request.
type contractEvent int

const (
	eventNone contractEvent = iota
	// eventExit: the entrypoint exits (Target.Exit, or by itself).
	eventExit
	// eventExpire: the timeout passes (Target.Expire, or waiting for it).
	eventExpire
	// eventDelete: DELETE of the sandbox, which must answer 204 and no body.
	eventDelete
)

// contractAnswer is an answer reduced to what the contract compares.
type contractAnswer struct {
	Status int
	// State, Reason and Message are the sandbox's status, or that of the
	// only item of a list.
	State, Reason, Message string
	// Entrypoint is the sandbox's entrypoint (of the only item of a list)
	// as JSON.
	Entrypoint string
	// Items is the number of items of a list answer.
	Items int
	// Code and Error are an ErrorResponse's code and message; Error is the
	// body itself if it is of no shape the contract knows (and must then
	// not occur).
	Code, Error string
}

// contractCreate is a create request body of runtime rt: {image} and
// {metadata} are filled in by the run. On Kubernetes the limits are also
// the Pod's requests, so they are small: seven sandboxes at once on a
// two-core test node.
func contractCreate(rt Runtime, cmd string, timeout int) string {
	limits := `{"cpu":"500m","memory":"256Mi"}`
	if rt == Kubernetes {
		limits = `{"cpu":"100m","memory":"64Mi"}`
	}
	return fmt.Sprintf(`{"image":{"uri":"{image}"},"entrypoint":["/bin/sh","-c",%q],`+
		`"resourceLimits":%s,"timeout":%d,"metadata":{metadata}}`, cmd, limits, timeout)
}

// contractCreated is the answer to a create of runtime rt: the create
// blocks until the container runs (Docker) or the Pod is Ready
// (Kubernetes).
func contractCreated(rt Runtime) contractAnswer {
	if rt == Kubernetes {
		return contractAnswer{Status: http.StatusAccepted, State: "Running", Reason: "RUNNING", Message: "Sandbox is running"}
	}
	return contractAnswer{Status: http.StatusAccepted, State: "Running", Reason: "CONTAINER_RUNNING",
		Message: "Sandbox container started successfully."}
}

// contractAnswers are the answers that differ between the runtimes.
type contractAnswers struct {
	// running is GET of a running sandbox.
	running contractAnswer
	// notFound is the 404 of a sandbox that does not exist ({id}).
	notFound contractAnswer
	// exited is GET of a sandbox whose entrypoint exited with code 0 or 1,
	// once the server shows it.
	exited [2]contractAnswer
	// wrap is what GET and List put before the entrypoint the create asked
	// for (the create's answer shows it as asked).
	wrap []string
}

// answers returns runtime rt's answers.
func answers(rt Runtime) contractAnswers {
	if rt == Kubernetes {
		// The kubelet restarts an exited entrypoint (the template's
		// restartPolicy is Always); the controller turns the crash loop into
		// phase Failed, whatever the code; never Terminated.
		crashLoop := contractAnswer{Status: http.StatusOK, State: "Failed", Reason: "FAILED",
			Message: "1/1 observed pods failed; primary reason=CrashLoopBackOff; sample pod={id}-0"}
		return contractAnswers{
			running:  contractAnswer{Status: http.StatusOK, State: "Running", Reason: "RUNNING", Message: "Sandbox is running"},
			notFound: contractAnswer{Status: http.StatusNotFound, Code: "KUBERNETES::SANDBOX_NOT_FOUND", Error: "Sandbox '{id}' not found"},
			exited:   [2]contractAnswer{crashLoop, crashLoop},
			// The container's command is bootstrap.sh wrapping the
			// entrypoint; GET and List show the container's command.
			wrap: []string{"/opt/opensandbox/bootstrap.sh"},
		}
	}
	return contractAnswers{
		running:  contractAnswer{Status: http.StatusOK, State: "Running", Reason: "CONTAINER_RUNNING", Message: "Sandbox container is running."},
		notFound: contractAnswer{Status: http.StatusNotFound, Code: "DOCKER::SANDBOX_NOT_FOUND", Error: "Sandbox {id} not found."},
		exited: [2]contractAnswer{
			{Status: http.StatusOK, State: "Terminated", Reason: "CONTAINER_EXITED", Message: "Sandbox container exited successfully."},
			{Status: http.StatusOK, State: "Failed", Reason: "CONTAINER_EXITED_ERROR", Message: "Sandbox container exited with code 1."},
		},
	}
}

func contractCases(rt Runtime) []contractCase {
	a := answers(rt)
	running, notFound := a.running, a.notFound
	unknown := notFound
	unknown.Error = strings.ReplaceAll(unknown.Error, "{id}", "gdr-contract-no-such-sandbox")
	forever := &contractSandbox{timeout: 600}
	listed := running
	listed.Items = 1
	return []contractCase{
		{name: "create-answers-running", method: "POST", path: "/v1/sandboxes", body: contractCreate(rt, "sleep 3600", 600),
			want: contractCreated(rt), listed: 1},
		{name: "get-running", setup: forever, method: "GET", path: "/v1/sandboxes/{id}", want: running, listed: 1},
		{name: "list-by-metadata", setup: forever, method: "GET", path: "/v1/sandboxes?metadata={filter}", want: listed, listed: 1},
		{name: "exit-0", setup: &contractSandbox{exits: true, code: 0, timeout: 600}, event: eventExit,
			method: "GET", path: "/v1/sandboxes/{id}", listed: 1, want: a.exited[0]},
		{name: "exit-1", setup: &contractSandbox{exits: true, code: 1, timeout: 600}, event: eventExit,
			method: "GET", path: "/v1/sandboxes/{id}", listed: 1, want: a.exited[1]},
		{name: "delete-then-get-404", setup: forever, event: eventDelete, method: "GET", path: "/v1/sandboxes/{id}", want: notFound},
		{name: "delete-unknown-404", method: "DELETE", path: "/v1/sandboxes/gdr-contract-no-such-sandbox", want: unknown},
		{name: "get-unknown-404", method: "GET", path: "/v1/sandboxes/gdr-contract-no-such-sandbox", want: unknown},
		{name: "timeout-above-max-400", method: "POST", path: "/v1/sandboxes", body: contractCreate(rt, "sleep 3600", 86401),
			want: contractAnswer{Status: http.StatusBadRequest, Code: "SANDBOX::INVALID_PARAMETER", Error: "Sandbox timeout 86401s exceeds configured maximum of 86400s."}},
		{name: "no-api-key-401", method: "GET", path: "/v1/sandboxes", noKey: true,
			want: contractAnswer{Status: http.StatusUnauthorized, Code: "MISSING_API_KEY", Error: "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header."}},
		// The only case that waits for real time on a real server (the
		// least timeout the specification allows, 60 s).
		{name: "expiry-removes-404", setup: &contractSandbox{timeout: 60}, event: eventExpire, method: "GET", path: "/v1/sandboxes/{id}", want: notFound},
	}
}

// RunContract runs the contract's cases against target, in parallel
// subtests of one subtest "contract", and returns when all have ended.
// Each case compares the status, the sandbox's state, reason and message,
// and the error code and message with what the real server of
// target.Runtime answered; a difference fails the case. Sandboxes a case created
// are deleted when it ends.
func RunContract(t *testing.T, target Target) {
	t.Helper()
	if target.APIKey == "" || target.Wait <= 0 {
		t.Fatal("sandboxapitest: RunContract: the target needs an API key and a positive Wait")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	run := "c" + hex.EncodeToString(b)
	t.Run("contract", func(t *testing.T) {
		for _, tc := range contractCases(target.Runtime) {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				r := &contractRun{t: t, target: target, tc: tc,
					md: map[string]string{"gdr-contract-run": run, "gdr-contract-case": tc.name}}
				r.run()
			})
		}
	})
}

// contractRun is one case against one target.
type contractRun struct {
	t      *testing.T
	target Target
	tc     contractCase
	md     map[string]string
	id     string // the case's sandbox, once created
}

func (r *contractRun) run() {
	t, tc := r.t, r.tc
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+r.target.Wait)
	defer cancel()
	due := time.Now()
	if tc.setup != nil {
		a, id, expires := r.create(ctx, contractCreate(r.target.Runtime, tc.setup.command(), tc.setup.timeout))
		if want := r.withEntrypoint(contractCreated(r.target.Runtime), true); a != want {
			t.Fatalf("create of the case's sandbox: %+v, want %+v", a, want)
		}
		switch tc.event {
		case eventExit:
			if r.target.Exit != nil {
				r.target.Exit(id, tc.setup.code)
			} else {
				due = time.Now().Add(2 * time.Second)
			}
		case eventExpire:
			if r.target.Expire != nil {
				r.target.Expire(id)
			} else {
				due = expires
			}
		case eventDelete:
			if status, body := r.do(ctx, "DELETE", "/v1/sandboxes/"+id, "", false); status != http.StatusNoContent || len(body) != 0 {
				t.Fatalf("DELETE of the case's sandbox: %d %q, want 204 and no body", status, body)
			}
		}
	}

	var got contractAnswer
	deadline := due.Add(r.target.Wait)
	poll := min(500*time.Millisecond, r.target.Wait/20)
	last := ""
	for {
		status, body := r.do(ctx, tc.method, r.expand(tc.path), r.expand(tc.body), tc.noKey)
		if now := fmt.Sprintf("%d %s", status, body); now != last {
			t.Logf("%s %s -> %s", tc.method, tc.path, now)
			last = now
		}
		var ids []string
		got, ids = parseContractAnswer(status, body)
		if tc.method == "POST" && status == http.StatusAccepted && len(ids) == 1 {
			r.adopt(ids[0])
		}
		if tc.event == eventExpire && r.target.Expire == nil && status == http.StatusNotFound && time.Now().Before(due.Add(-r.earliestExpiry())) {
			t.Errorf("the sandbox was gone before it expired at %s", due.Format(time.RFC3339Nano))
		}
		if !r.pending(got) || time.Now().After(deadline) {
			break
		}
		time.Sleep(poll)
	}
	want := r.withEntrypoint(tc.want, tc.method == "POST")
	want.Message = strings.ReplaceAll(want.Message, "{id}", r.id)
	want.Error = strings.ReplaceAll(want.Error, "{id}", r.id)
	if got != want {
		t.Errorf("%s %s: answered %+v, want %+v", tc.method, tc.path, got, want)
	}
	r.checkListed(ctx, want)
}

// pending reports whether a answers before the case's event showed, so
// the case polls on: the sandbox still runs after an exit or an expiry; on
// Docker it flashes Failed with code 137 (killed at expiry, before its
// removal); on Kubernetes it is Pending (CREATING) between an exit and the
// kubelet's restart, until the crash loop makes it Failed.
func (r *contractRun) pending(a contractAnswer) bool {
	if a.Status != http.StatusOK {
		return false
	}
	k8s := r.target.Runtime == Kubernetes
	a.Entrypoint = "" // compared with the final answer, not here
	switch r.tc.event {
	case eventExit:
		return a.State == "Running" || k8s && a.State == "Pending" && a.Reason == "CREATING"
	case eventExpire:
		return a.State == "Running" || !k8s && (a == dockerKilledAtExpiry || a == dockerRemovingAtExpiry)
	}
	return false
}

// The real server's answers on Docker between an expiry and the sandbox's removal: killed (137),
// then, while dockerd removes the container (seconds when the machine is busy; seen in CI on
// 2026-12-07), "removing".
var (
	dockerKilledAtExpiry = contractAnswer{Status: http.StatusOK, State: "Failed", Reason: "CONTAINER_EXITED_ERROR",
		Message: "Sandbox container exited with code 137."}
	dockerRemovingAtExpiry = contractAnswer{Status: http.StatusOK, State: "Unknown", Reason: "CONTAINER_STATE_UNKNOWN",
		Message: "Sandbox container is in state 'removing'."}
)

// withEntrypoint returns want, if it is a sandbox's answer, with the
// entrypoint the server shows for the case's sandbox: as the create asked
// for it in a create's answer, else with the runtime's wrap before it.
func (r *contractRun) withEntrypoint(want contractAnswer, created bool) contractAnswer {
	if want.State == "" {
		return want
	}
	cmd := "sleep 3600" // the case that creates
	if r.tc.setup != nil {
		cmd = r.tc.setup.command()
	}
	ep := []string{"/bin/sh", "-c", cmd}
	if !created {
		ep = append(slices.Clone(answers(r.target.Runtime).wrap), ep...)
	}
	b, err := json.Marshal(ep)
	if err != nil {
		panic(err) // strings
	}
	want.Entrypoint = string(b)
	return want
}

// earliestExpiry is how long before its expiresAt a real server may
// remove a sandbox without failing the case: Docker's timer, half a
// second; on Kubernetes the BatchSandbox controller acts on spec.expireTime
// (observed 50 to 280 ms after expiresAt, never before), allowed a second
// as the controller's clock is another process's.
func (r *contractRun) earliestExpiry() time.Duration {
	if r.target.Runtime == Kubernetes {
		return time.Second
	}
	return 500 * time.Millisecond
}

// checkListed lists the sandboxes of the case's metadata: tc.listed of
// them, the case's sandbox in want's state.
func (r *contractRun) checkListed(ctx context.Context, want contractAnswer) {
	status, body := r.do(ctx, "GET", "/v1/sandboxes?metadata="+url.QueryEscape(contractFilter(r.md)), "", false)
	r.t.Logf("list by the case's metadata -> %d %s", status, body)
	a, ids := parseContractAnswer(status, body)
	if status != http.StatusOK || a.Items != r.tc.listed {
		r.t.Errorf("list by the case's metadata: %+v, want %d items", a, r.tc.listed)
		return
	}
	if r.tc.listed == 1 && (ids[0] != r.id || a.State != want.State || a.Reason != want.Reason) {
		r.t.Errorf("list by the case's metadata: %s %+v, want %s in state %s (%s)", ids[0], a, r.id, want.State, want.Reason)
	}
}

// create creates the case's sandbox from body and returns the answer, the
// sandbox's ID and its expiry.
func (r *contractRun) create(ctx context.Context, body string) (contractAnswer, string, time.Time) {
	status, resp := r.do(ctx, "POST", "/v1/sandboxes", r.expand(body), false)
	r.t.Logf("create of the case's sandbox -> %d %s", status, resp)
	a, ids := parseContractAnswer(status, resp)
	if status != http.StatusAccepted || len(ids) != 1 {
		r.t.Fatalf("create of the case's sandbox: %d %s", status, resp)
	}
	r.adopt(ids[0])
	var v struct {
		ExpiresAt time.Time `json:"expiresAt"`
	}
	if err := json.Unmarshal(resp, &v); err != nil || v.ExpiresAt.IsZero() {
		r.t.Fatalf("create of the case's sandbox: no expiresAt in %s (%v)", resp, err)
	}
	return a, ids[0], v.ExpiresAt
}

// adopt makes id the case's sandbox, deleted when the case ends.
func (r *contractRun) adopt(id string) {
	if r.id != "" {
		return
	}
	r.id = id
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if status, body := r.do(ctx, "DELETE", "/v1/sandboxes/"+id, "", false); status != http.StatusNoContent && status != http.StatusNotFound {
			r.t.Errorf("delete the case's sandbox %s: %d %s", id, status, body)
		}
	})
}

// expand fills in a path or body of the case.
func (r *contractRun) expand(s string) string {
	md, err := json.Marshal(r.md)
	if err != nil {
		panic(err) // a map of strings
	}
	return strings.NewReplacer("{id}", r.id, "{image}", r.target.Image, "{metadata}", string(md),
		"{filter}", url.QueryEscape(contractFilter(r.md))).Replace(s)
}

// contractFilter is md as the server's metadata filter: a URL-encoded query.
func contractFilter(md map[string]string) string {
	q := url.Values{}
	for k, v := range md {
		q.Set(k, v)
	}
	return q.Encode()
}

// do sends one request as it is and returns the answer's status and body;
// a request that gets no answer fails the case. The caller logs.
func (r *contractRun) do(ctx context.Context, method, path, body string, noKey bool) (int, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.target.URL+path, rd)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if !noKey {
		req.Header.Set(apiKeyHeader, r.target.APIKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// parseContractAnswer reduces an answer to what the contract compares, and
// returns the IDs of the sandboxes it holds.
func parseContractAnswer(status int, body []byte) (contractAnswer, []string) {
	a := contractAnswer{Status: status}
	if len(body) == 0 {
		return a, nil
	}
	type item struct {
		ID         string          `json:"id"`
		Entrypoint json.RawMessage `json:"entrypoint"`
		Status     *struct {
			State   string `json:"state"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"status"`
	}
	var v struct {
		item
		Items   *[]item `json:"items"`
		Code    *string `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		a.Error = string(body)
		return a, nil
	}
	var ids []string
	one := v.item
	switch {
	case v.Items != nil:
		a.Items = len(*v.Items)
		for _, it := range *v.Items {
			ids = append(ids, it.ID)
		}
		if len(*v.Items) == 1 {
			one = (*v.Items)[0]
		}
	case v.Code != nil && v.Message != nil:
		a.Code, a.Error = *v.Code, *v.Message
		return a, nil
	case v.ID != "":
		ids = []string{v.ID}
	default:
		a.Error = string(body)
		return a, nil
	}
	if one.Status != nil {
		a.State, a.Reason, a.Message = one.Status.State, one.Status.Reason, one.Status.Message
		var ep []string
		if err := json.Unmarshal(one.Entrypoint, &ep); err == nil {
			b, _ := json.Marshal(ep) // compact, as withEntrypoint writes it
			a.Entrypoint = string(b)
		} else {
			a.Entrypoint = string(one.Entrypoint)
		}
	}
	return a, ids
}
