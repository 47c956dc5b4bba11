// Package sandboxapitest is a fake OpenSandbox lifecycle server for tests:
// in memory, on 127.0.0.1, and strict.
//
// It answers as the real server does, as observed and recorded in
// docs/OPENSANDBOX.md (the Docker runtime, by default) and
// docs/OPENSANDBOX-KUBERNETES.md (WithRuntime(Kubernetes)): create answers
// the sandbox Running; an entrypoint that exits (Exit) leaves it Terminated
// or Failed with the server's reasons and messages (on Kubernetes, Pending
// and then Failed by CrashLoopBackOff); an expired sandbox (Expire, or its
// timeout passing) is removed, never Terminated; the error bodies carry the
// server's codes and messages. RunContract runs the same cases against this
// fake and against a real server, so that neither drifts from the other.
//
// Every request is validated against the specification the client is
// generated from (shared/backend/opensandbox/sandboxapi/spec, through kin-openapi's
// openapi3filter), and so is every response the fake sends: a response that
// breaks the specification fails the test that caused it. On top of the
// specification the fake enforces what the real server does beyond it (see
// shared/backend/opensandbox/sandboxapi): metadata label rules and the reserved opensandbox.io/
// prefix (400 SANDBOX::INVALID_METADATA_LABEL), pageSize <= 200, image,
// entrypoint and resourceLimits unless extensions.poolRef, 422 with FastAPI's
// {"detail": [...]} for invalid requests, 202 on create, 204 on delete and 404
// afterwards, a timeout above the server's maximum (400
// SANDBOX::INVALID_PARAMETER), 401 MISSING_API_KEY or INVALID_API_KEY, the `metadata` filter and repeated `state` filter of the list,
// and merge-patch metadata where null deletes. A request the real server
// would refuse is refused here too, so the fake cannot hide a client bug.
//
// Tests drive what a real server decides on its own: state transitions
// (SetState, Transition), an entrypoint's exit (Exit), expiry (Expire),
// Kubernetes' create timeout (InjectPodReadyTimeout), faults (Inject, FailNext: 429 or 5xx, before or
// after the request took effect; SetFaults: a fault rate, including answers
// that never come) and latency (SetLatency). Created records every sandbox
// ever created, deleted ones included.
package sandboxapitest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	// URL is the base URL a client is configured with
	// (opensandbox.Options.BaseURL); the API is under URL + "/v1".
	URL string

	t        testing.TB
	srv      *httptest.Server
	contract *contract
	rules    labelRules
	opts     options

	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	seq        int
	creates    int
	calls      map[string]int
	faults     []Fault
	faultFunc  func(method, path string) *Fault
	created    []Sandbox
	deleted    map[string]time.Time // when each removed sandbox was removed
	latency    time.Duration
	rejections []Rejection
	// podReadyTimeouts queues the next creates' 504s (Kubernetes): true
	// keeps the sandbox, false removes it as the server's cleanup does.
	podReadyTimeouts []bool
}

// Option configures New.
type Option func(*options)

type options struct {
	apiKey     string
	runtime    Runtime
	maxTimeout time.Duration
	crashLoop  time.Duration
}

// WithAPIKey makes the fake require key in OPEN-SANDBOX-API-KEY, answering
// 401 MISSING_API_KEY without it and 401 INVALID_API_KEY with another. By
// default, like a real server started without a key, it accepts every
// request.
func WithAPIKey(key string) Option { return func(o *options) { o.apiKey = key } }

// Runtime is the server's runtime ([runtime] type in its configuration),
// which decides the states, reasons and error codes it answers.
type Runtime int

const (
	// Docker is the docker runtime: create answers Running; an exited
	// entrypoint leaves the sandbox Terminated (exit 0) or Failed; errors
	// are DOCKER::*.
	Docker Runtime = iota
	// Kubernetes is the kubernetes runtime with the batchsandbox provider:
	// create answers Running (after waiting for the Pod, or 504
	// KUBERNETES::POD_READY_TIMEOUT); an exited entrypoint is restarted, the
	// sandbox Pending and then Failed (CrashLoopBackOff), never Terminated;
	// errors are KUBERNETES::*.
	Kubernetes
)

func (r Runtime) String() string {
	if r == Kubernetes {
		return "kubernetes"
	}
	return "docker"
}

// WithRuntime makes the fake answer as a server of runtime r; the default
// is Docker.
func WithRuntime(r Runtime) Option { return func(o *options) { o.runtime = r } }

// DefaultMaxTimeout is the server's default max_sandbox_timeout_seconds.
const DefaultMaxTimeout = 86400 * time.Second

// WithMaxTimeout sets the largest timeout a create may ask for (the
// server's max_sandbox_timeout_seconds, whole seconds), DefaultMaxTimeout
// unless set; a larger one is answered 400 SANDBOX::INVALID_PARAMETER.
func WithMaxTimeout(d time.Duration) Option { return func(o *options) { o.maxTimeout = d } }

// DefaultCrashLoopBackOff is how long after its entrypoint's first exit a
// Kubernetes sandbox turns Failed: 12 to 17 s observed
// (docs/OPENSANDBOX-KUBERNETES.md).
const DefaultCrashLoopBackOff = 15 * time.Second

// WithCrashLoopBackOff sets how long a Kubernetes sandbox stays Pending
// after Exit before it is Failed (CrashLoopBackOff); DefaultCrashLoopBackOff
// unless set. Zero or less makes it Failed at once.
func WithCrashLoopBackOff(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			d = time.Nanosecond
		}
		o.crashLoop = d
	}
}

// New starts a fake on 127.0.0.1 and stops it when t ends.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{maxTimeout: DefaultMaxTimeout, crashLoop: DefaultCrashLoopBackOff}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{t: t, opts: o, rules: newLabelRules(), sandboxes: map[string]*sandbox{}, calls: map[string]int{}}
	s.srv = httptest.NewUnstartedServer(s)
	s.URL = "http://" + s.srv.Listener.Addr().String()
	c, err := newContract(s.URL, o.apiKey)
	if err != nil {
		s.srv.Close()
		t.Fatalf("sandboxapitest: %v", err)
	}
	s.contract = c
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

// Sandbox is what the fake holds about one sandbox, including what the
// real server would not show (its environment and creation request).
type Sandbox struct {
	ID    string
	State string
	// Reason and Message detail State as the server words them; Message
	// is empty after SetState and Transition.
	Reason         string
	Message        string
	PoolRef        string
	Image          string
	Entrypoint     []string
	ResourceLimits map[string]string
	Env            map[string]string
	Metadata       map[string]string
	// Timeout is the requested lifetime in seconds; zero means none.
	Timeout   int
	CreatedAt time.Time
}

type sandbox struct {
	Sandbox
	seq          int
	expiresAt    time.Time
	transitionAt time.Time
	// crashLoopAt, when set, is when a Kubernetes sandbox whose entrypoint
	// exited turns Failed (CrashLoopBackOff).
	crashLoopAt time.Time
}

// setStatus moves sb to a state, ending a pending crash loop.
func (sb *sandbox) setStatus(state, reason, message string) {
	sb.State, sb.Reason, sb.Message = state, reason, message
	sb.transitionAt = time.Now().UTC()
	sb.crashLoopAt = time.Time{}
}

func (sb *sandbox) snapshot() Sandbox {
	c := sb.Sandbox
	c.Entrypoint = slices.Clone(c.Entrypoint)
	c.ResourceLimits = maps.Clone(c.ResourceLimits)
	c.Env = maps.Clone(c.Env)
	c.Metadata = maps.Clone(c.Metadata)
	return c
}

// Fault is a failure the fake answers instead of the real answer.
type Fault struct {
	// Method limits the fault to requests of that method; empty means any.
	Method string
	// Status is 429 or a 5xx.
	Status int
	// Times is how many matching requests get the fault (at least one).
	Times int
	// AfterEffect lets the request take effect first and then replaces its
	// answer: an answer lost on its way back.
	AfterEffect bool
	// RetryAfter, if positive, is sent as Retry-After (seconds).
	RetryAfter int
	// Drop closes the connection instead of answering (Status is then
	// ignored): a request that timed out, or whose answer never came back
	// (with AfterEffect). Only SetFaults may return it.
	Drop bool
}

// SetFaults makes f decide, for every request that no injected fault
// matches, whether it fails: f is called with the request's method and
// specification path (as Calls names them) and returns the fault to apply,
// or nil. A random f injects a fault rate (a chaos test). f is called with
// no lock held and must be safe for concurrent use; nil removes it.
func (s *Server) SetFaults(f func(method, path string) *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultFunc = f
}

// Created returns every sandbox created so far, deleted ones included, as
// it was when it was created, oldest first: what a test counts creations
// per assignment with.
func (s *Server) Created() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Sandbox, len(s.created))
	for i, sb := range s.created {
		out[i] = sb
		out[i].Metadata = maps.Clone(sb.Metadata)
	}
	return out
}

// Transition moves sandbox id to state, as SetState does, and reports
// whether it exists; a sandbox deleted meanwhile is no failure (an executor
// simulated beside a backend that may delete it at any time).
func (s *Server) Transition(id, state string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.live(id)
	if ok {
		sb.setStatus(state, "test_transition", "")
	}
	return ok
}

// Inject queues f: the next f.Times requests matching f.Method get it.
// Faults are matched in the order they were injected.
func (s *Server) Inject(f Fault) {
	s.t.Helper()
	if f.Status != http.StatusTooManyRequests && (f.Status < 500 || f.Status > 599) {
		s.t.Fatalf("sandboxapitest: a fault is a 429 or a 5xx, not %d", f.Status)
	}
	if f.Times < 1 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// FailNext makes the next n requests, whatever they are, answer status
// without taking effect.
func (s *Server) FailNext(n, status int) {
	s.t.Helper()
	s.Inject(Fault{Status: status, Times: n})
}

// SetLatency delays every later request by d before it is handled.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// SetState moves sandbox id to state (any string: the set is open), as the
// server does when the sandbox starts, ends or fails.
func (s *Server) SetState(id, state string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.live(id)
	if !ok {
		s.t.Fatalf("sandboxapitest: SetState: no sandbox %q", id)
	}
	sb.setStatus(state, "test_transition", "")
}

// Exit makes the entrypoint of sandbox id exit with code, as the real
// server then reports it. Docker: Terminated, reason CONTAINER_EXITED,
// message "Sandbox container exited successfully." for 0; Failed,
// CONTAINER_EXITED_ERROR, "Sandbox container exited with code N." otherwise.
// Either stays (GET, List) until its expiry. Kubernetes, whatever the code
// (the kubelet restarts the container): Pending, CREATING, then, after the
// crash-loop back-off (WithCrashLoopBackOff), Failed, FAILED, "1/1 observed
// pods failed; primary reason=CrashLoopBackOff; sample pod=<id>-0"; never
// Terminated. A sandbox that does not exist fails the test.
func (s *Server) Exit(id string, code int) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.live(id)
	if !ok {
		s.t.Fatalf("sandboxapitest: Exit: no sandbox %q", id)
	}
	switch {
	case s.opts.runtime == Kubernetes:
		if sb.State == "Failed" && sb.Reason == "FAILED" {
			return // Failed is sticky once the crash loop showed
		}
		crash := sb.crashLoopAt
		sb.setStatus("Pending", "CREATING", "Sandbox is being created")
		if crash.IsZero() {
			crash = sb.transitionAt.Add(s.opts.crashLoop)
		}
		sb.crashLoopAt = crash
	case code == 0:
		sb.setStatus("Terminated", "CONTAINER_EXITED", "Sandbox container exited successfully.")
	default:
		sb.setStatus("Failed", "CONTAINER_EXITED_ERROR", fmt.Sprintf("Sandbox container exited with code %d.", code))
	}
}

// Expire makes sandbox id expire now, as when its timeout passes: the
// server removes it (GET and DELETE then answer 404, List leaves it out);
// it is never Terminated for an expiry. A sandbox that does not exist fails
// the test.
func (s *Server) Expire(id string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.live(id); !ok {
		s.t.Fatalf("sandboxapitest: Expire: no sandbox %q", id)
	}
	s.remove(id, time.Now())
}

// InjectPodReadyTimeout makes the next create (Kubernetes runtime only)
// answer 504 KUBERNETES::POD_READY_TIMEOUT, as the server does when the Pod
// is not Running within sandbox_create_timeout_seconds. The sandbox was
// created: with keep it stays, Pending (CREATING), as when the server's
// cleanup failed or a proxy before it timed out first (the caller must find
// it, not create another); without keep it is removed, as the server's
// cleanup (delete_workload) does. Created and Creates count it either way.
func (s *Server) InjectPodReadyTimeout(keep bool) {
	s.t.Helper()
	if s.opts.runtime != Kubernetes {
		s.t.Fatalf("sandboxapitest: InjectPodReadyTimeout: the %s runtime never answers it", s.opts.runtime)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.podReadyTimeouts = append(s.podReadyTimeouts, keep)
}

// SetMetadata writes one metadata key of sandbox id directly, bypassing
// every rule (nil deletes it): how a test tampers with metadata.
func (s *Server) SetMetadata(id, key string, value *string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.live(id)
	if !ok {
		s.t.Fatalf("sandboxapitest: SetMetadata: no sandbox %q", id)
	}
	if value == nil {
		delete(sb.Metadata, key)
	} else {
		sb.Metadata[key] = *value
	}
}

// Seed creates a sandbox as POST /sandboxes does, under the same server
// rules, but in process and without checking the request against the
// specification: to set up many sandboxes quickly (validating a request
// takes milliseconds). body is a CreateSandboxRequest in JSON; a body the
// server would refuse fails the test. It returns the sandbox's ID.
func (s *Server) Seed(body []byte) string {
	s.t.Helper()
	s.mu.Lock()
	resp := s.create(body, false)
	s.mu.Unlock()
	if resp.status != http.StatusAccepted {
		s.t.Fatalf("sandboxapitest: Seed: the server would answer %d: %s", resp.status, resp.body)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(resp.body, &created); err != nil {
		s.t.Fatalf("sandboxapitest: Seed: %v", err)
	}
	return created.ID
}

// remove removes sandbox id, which was removed at at. s.mu is held.
func (s *Server) remove(id string, at time.Time) {
	delete(s.sandboxes, id)
	if s.deleted == nil {
		s.deleted = map[string]time.Time{}
	}
	s.deleted[id] = at
}

// DeletedAt returns when sandbox id was removed (deleted, or at its
// expiry), false if it was not: it exists, or never did.
func (s *Server) DeletedAt(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.live(id); ok {
		return time.Time{}, false
	}
	at, ok := s.deleted[id]
	return at, ok
}

// Sandbox returns sandbox id, false if it does not exist (or was deleted).
func (s *Server) Sandbox(id string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.live(id)
	if !ok {
		return Sandbox{}, false
	}
	return sb.snapshot(), true
}

// Sandboxes returns every existing sandbox, oldest first.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Sandbox, 0, len(s.sandboxes))
	for _, sb := range s.ordered() {
		out = append(out, sb.snapshot())
	}
	return out
}

// Creates counts the sandboxes created so far (deleted ones included).
func (s *Server) Creates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates
}

// Calls counts the requests that reached an operation, by method and
// specification path, such as Calls("POST", "/sandboxes") or
// Calls("GET", "/sandboxes/{sandboxId}"); faulted and refused ones included.
func (s *Server) Calls(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method+" "+path]
}

// Rejection is a request the fake refused as the real server would.
type Rejection struct {
	Method string
	Path   string
	Status int
	// Code is the ErrorResponse code, or "" for a 404 route or a 422.
	Code   string
	Reason string
}

// Rejections returns the requests refused so far (4xx other than a 404 of
// a missing sandbox), oldest first.
func (s *Server) Rejections() []Rejection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rejections)
}

type response struct {
	status int
	header http.Header
	body   []byte
	// missing marks the 404 of a sandbox that does not exist: an answer,
	// not a refusal.
	missing bool
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	latency := s.latency
	s.mu.Unlock()
	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-r.Context().Done():
			return
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	in, verr := s.contract.validateRequest(r.Context(), r)
	if in == nil {
		// No operation: FastAPI's own answer, outside the specification,
		// unless the server's authentication middleware, which runs before
		// routing, refuses the request first.
		status := http.StatusNotFound
		body, _ := json.Marshal(map[string]string{"detail": "Not Found"})
		if errors.Is(verr, routers.ErrMethodNotAllowed) {
			status = http.StatusMethodNotAllowed
			body, _ = json.Marshal(map[string]string{"detail": "Method Not Allowed"})
		}
		if resp, refused := s.unauthorized(r); refused {
			status, body = resp.status, resp.body
		}
		s.reject(Rejection{Method: r.Method, Path: r.URL.Path, Status: status, Reason: verr.Error()})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return
	}
	op := r.Method + " " + in.Route.Path

	s.mu.Lock()
	s.calls[op]++
	fault := s.takeFault(r.Method)
	faultFunc := s.faultFunc
	s.mu.Unlock()
	if fault == nil && faultFunc != nil {
		fault = faultFunc(r.Method, in.Route.Path)
	}
	if fault != nil && fault.Drop && !fault.AfterEffect {
		drop(w)
		return
	}

	var resp response
	switch {
	case fault != nil && !fault.AfterEffect:
		resp = faultResponse(*fault)
	case verr != nil:
		var sec *openapi3filter.SecurityRequirementsError
		if unauth, refused := s.unauthorized(r); refused && errors.As(verr, &sec) {
			resp = unauth
		} else {
			resp = validationError("spec_violation", []any{"request"}, verr.Error(), nil)
		}
	default:
		resp = s.handle(op, r, in, body)
	}
	if fault != nil && fault.AfterEffect {
		if fault.Drop {
			drop(w)
			return
		}
		resp = faultResponse(*fault)
	}
	if fault == nil && resp.status >= 400 && resp.status < 500 && !resp.missing {
		rej := Rejection{Method: r.Method, Path: r.URL.Path, Status: resp.status, Reason: string(resp.body)}
		var e struct{ Code, Message string }
		if json.Unmarshal(resp.body, &e) == nil && e.Code != "" {
			rej.Code, rej.Reason = e.Code, e.Message
		}
		s.reject(rej)
	}
	s.send(w, r, in, resp)
}

// drop closes the request's connection without an answer.
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // the server closes the connection
}

// apiKeyHeader is the header the server reads its API key from.
const apiKeyHeader = "OPEN-SANDBOX-API-KEY"

// unauthorized returns the server's 401 for r and true if the fake requires
// an API key and r lacks it or carries another.
func (s *Server) unauthorized(r *http.Request) (response, bool) {
	if s.opts.apiKey == "" {
		return response{}, false
	}
	switch r.Header.Get(apiKeyHeader) {
	case s.opts.apiKey:
		return response{}, false
	case "":
		return errorResponse(http.StatusUnauthorized, "MISSING_API_KEY",
			"Authentication credentials are missing. Provide API key via "+apiKeyHeader+" header."), true
	default:
		return errorResponse(http.StatusUnauthorized, "INVALID_API_KEY",
			"Authentication credentials are invalid. Check your API key and try again."), true
	}
}

func (s *Server) reject(rej Rejection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejections = append(s.rejections, rej)
}

// takeFault returns the first queued fault matching method, consuming one
// of its times. s.mu is held.
func (s *Server) takeFault(method string) *Fault {
	for i := range s.faults {
		f := &s.faults[i]
		if f.Method != "" && !strings.EqualFold(f.Method, method) {
			continue
		}
		taken := *f
		if f.Times--; f.Times == 0 {
			s.faults = slices.Delete(s.faults, i, i+1)
		}
		return &taken
	}
	return nil
}

// send validates resp against the specification, failing the test if it
// breaks it, and writes it.
func (s *Server) send(w http.ResponseWriter, r *http.Request, in *openapi3filter.RequestValidationInput, resp response) {
	h := resp.header
	if h == nil {
		h = http.Header{}
	}
	if id := r.Header.Get("X-Request-ID"); id != "" {
		h.Set("X-Request-ID", id) // the real server echoes what was sent
	} else {
		h.Set("X-Request-ID", newUUID())
	}
	if len(resp.body) > 0 {
		h.Set("Content-Type", "application/json")
	}
	if err := s.contract.validateResponse(r.Context(), in, resp.status, h, resp.body); err != nil {
		s.t.Errorf("sandboxapitest: the fake's answer %d to %s %s breaks the OpenSandbox specification: %v",
			resp.status, r.Method, r.URL.Path, err)
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

func (s *Server) handle(op string, r *http.Request, in *openapi3filter.RequestValidationInput, body []byte) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := in.PathParams["sandboxId"]
	switch op {
	case "GET /sandboxes":
		return s.list(r.URL.Query())
	case "POST /sandboxes":
		return s.create(body, true)
	case "GET /sandboxes/{sandboxId}":
		sb, ok := s.live(id)
		if !ok {
			return s.notFound(id)
		}
		return jsonResponse(http.StatusOK, s.sandboxJSON(sb, true))
	case "DELETE /sandboxes/{sandboxId}":
		if _, ok := s.live(id); !ok {
			return s.notFound(id)
		}
		s.remove(id, time.Now())
		return response{status: http.StatusNoContent}
	case "PATCH /sandboxes/{sandboxId}/metadata":
		return s.patch(id, body)
	}
	return errorResponse(http.StatusInternalServerError, "FAKE::NOT_IMPLEMENTED", op+" is not implemented by the fake")
}

// create creates a sandbox as POST /sandboxes does; request marks a real
// request, which an injected pod-ready timeout applies to. s.mu is held.
func (s *Server) create(body []byte, request bool) response {
	var req struct {
		Image *struct {
			URI string `json:"uri"`
		} `json:"image"`
		SnapshotID     *string           `json:"snapshotId"`
		Timeout        *int              `json:"timeout"`
		ResourceLimits map[string]string `json:"resourceLimits"`
		Env            map[string]string `json:"env"`
		Metadata       map[string]string `json:"metadata"`
		Entrypoint     []string          `json:"entrypoint"`
		Extensions     map[string]string `json:"extensions"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return validationError("json_invalid", []any{"body"}, err.Error(), nil)
	}
	poolRef := req.Extensions["poolRef"]
	switch {
	case req.Image != nil && req.SnapshotID != nil:
		return validationError("value_error", []any{"body"}, "Value error, exactly one of image or snapshotId may be given", nil)
	case poolRef != "" && req.SnapshotID != nil:
		return validationError("value_error", []any{"body"}, "Value error, snapshotId cannot be combined with extensions.poolRef", nil)
	case poolRef == "" && req.Image == nil && req.SnapshotID == nil:
		return validationError("missing", []any{"body", "image"}, "Field required: image or snapshotId unless extensions.poolRef", nil)
	case poolRef == "" && req.ResourceLimits == nil:
		return validationError("missing", []any{"body", "resourceLimits"}, "Field required unless extensions.poolRef", nil)
	case poolRef == "" && req.Image != nil && len(req.Entrypoint) == 0:
		return validationError("missing", []any{"body", "entrypoint"}, "Field required with image unless extensions.poolRef", nil)
	case req.SnapshotID != nil:
		return errorResponse(http.StatusBadRequest, "FAKE::UNSUPPORTED", "the fake has no snapshots")
	}
	if err := s.rules.check(req.Metadata, nil); err != nil {
		return errorResponse(http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", err.Error())
	}
	if maxSec := int(s.opts.maxTimeout / time.Second); req.Timeout != nil && *req.Timeout > maxSec {
		return errorResponse(http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("Sandbox timeout %ds exceeds configured maximum of %ds.", *req.Timeout, maxSec))
	}
	s.seq++
	s.creates++
	sb := &sandbox{seq: s.seq, Sandbox: Sandbox{
		ID:             newSandboxID(),
		PoolRef:        poolRef,
		Entrypoint:     slices.Clone(req.Entrypoint),
		ResourceLimits: maps.Clone(req.ResourceLimits),
		Env:            maps.Clone(req.Env),
		Metadata:       maps.Clone(req.Metadata),
		CreatedAt:      time.Now().UTC(),
	}}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if req.Image != nil {
		sb.Image = req.Image.URI
	}
	if len(sb.Entrypoint) == 0 {
		// A pool sandbox without one runs its template's; the fake's
		// template runs the server's default.
		sb.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if req.Timeout != nil {
		sb.Timeout = *req.Timeout
		sb.expiresAt = sb.CreatedAt.Add(time.Duration(*req.Timeout) * time.Second)
	}
	// Create blocks until the sandbox runs: the answer is Running.
	answered := ""
	if s.opts.runtime == Kubernetes {
		sb.setStatus("Running", "RUNNING", "Sandbox is running")
	} else {
		sb.setStatus("Running", "CONTAINER_RUNNING", "Sandbox container is running.")
		answered = "Sandbox container started successfully."
	}
	timedOut, keep := false, false
	if request && len(s.podReadyTimeouts) > 0 {
		timedOut, keep = true, s.podReadyTimeouts[0]
		s.podReadyTimeouts = s.podReadyTimeouts[1:]
		sb.setStatus("Pending", "CREATING", "Sandbox is being created")
	}
	s.sandboxes[sb.ID] = sb
	s.created = append(s.created, sb.snapshot())
	if timedOut {
		if !keep {
			s.remove(sb.ID, time.Now())
		}
		return errorResponse(http.StatusGatewayTimeout, "KUBERNETES::POD_READY_TIMEOUT",
			fmt.Sprintf("Timeout waiting for sandbox %s to be Running with IP. Elapsed: 60.0s, Last state: Pending", sb.ID))
	}
	v := s.sandboxJSON(sb, false)
	if answered != "" {
		v["status"].(map[string]any)["message"] = answered
	}
	resp := jsonResponse(http.StatusAccepted, v)
	resp.header = http.Header{"Location": {s.URL + "/v1/sandboxes/" + url.PathEscape(sb.ID)}}
	return resp
}

func (s *Server) list(q url.Values) response {
	page, pageSize := 1, 20
	if v := q.Get("page"); v != "" {
		page, _ = strconv.Atoi(v) // the specification made it an integer >= 1
	}
	if v := q.Get("pageSize"); v != "" {
		pageSize, _ = strconv.Atoi(v)
	}
	if pageSize > 200 {
		return validationError("less_than_equal", []any{"query", "pageSize"}, "Input should be less than or equal to 200", q.Get("pageSize"))
	}
	var filter url.Values
	if q.Has("metadata") {
		var err error
		if filter, err = url.ParseQuery(q.Get("metadata")); err != nil {
			return errorResponse(http.StatusBadRequest, "SANDBOX::INVALID_METADATA_FILTER", "metadata filter is not a URL-encoded query string")
		}
	}
	states := q["state"]
	var matched []*sandbox
	for _, sb := range s.ordered() {
		if len(states) > 0 && !slices.ContainsFunc(states, func(st string) bool { return strings.EqualFold(st, sb.State) }) {
			continue
		}
		if !matches(sb.Metadata, filter) {
			continue
		}
		matched = append(matched, sb)
	}
	total := len(matched)
	totalPages := (total + pageSize - 1) / pageSize
	items := []any{}
	if start := (page - 1) * pageSize; start < total {
		for _, sb := range matched[start:min(total, start+pageSize)] {
			items = append(items, s.sandboxJSON(sb, true))
		}
	}
	return jsonResponse(http.StatusOK, map[string]any{
		"items": items,
		"pagination": map[string]any{
			"page": page, "pageSize": pageSize, "totalItems": total,
			"totalPages": totalPages, "hasNextPage": page < totalPages,
		},
	})
}

func matches(md map[string]string, filter url.Values) bool {
	for k, vs := range filter {
		got, ok := md[k]
		if !ok {
			return false
		}
		for _, v := range vs {
			if got != v {
				return false
			}
		}
	}
	return true
}

func (s *Server) patch(id string, body []byte) response {
	sb, ok := s.live(id)
	if !ok {
		return s.notFound(id)
	}
	var p map[string]*string
	if err := json.Unmarshal(body, &p); err != nil {
		return validationError("json_invalid", []any{"body"}, err.Error(), nil)
	}
	set := map[string]string{}
	var deleted []string
	for k, v := range p {
		if v == nil {
			deleted = append(deleted, k)
		} else {
			set[k] = *v
		}
	}
	if err := s.rules.check(set, deleted); err != nil {
		return errorResponse(http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", err.Error())
	}
	for _, k := range deleted {
		delete(sb.Metadata, k)
	}
	maps.Copy(sb.Metadata, set)
	return jsonResponse(http.StatusOK, s.sandboxJSON(sb, true))
}

// ordered returns the live sandboxes (see live) oldest first. s.mu is held.
func (s *Server) ordered() []*sandbox {
	out := make([]*sandbox, 0, len(s.sandboxes))
	for _, id := range slices.Collect(maps.Keys(s.sandboxes)) {
		if sb, ok := s.live(id); ok {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *sandbox) int { return a.seq - b.seq })
	return out
}

// live returns sandbox id after what time did to it, false if it does not
// exist: at its expiresAt the server removes it (never Terminated); once
// the crash-loop back-off after an exit passed, a Kubernetes sandbox is
// Failed. s.mu is held.
func (s *Server) live(id string) (*sandbox, bool) {
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, false
	}
	now := time.Now()
	if !sb.expiresAt.IsZero() && !now.Before(sb.expiresAt) {
		s.remove(id, sb.expiresAt)
		return nil, false
	}
	if at := sb.crashLoopAt; !at.IsZero() && !now.Before(at) {
		sb.setStatus("Failed", "FAILED", fmt.Sprintf(
			"1/1 observed pods failed; primary reason=CrashLoopBackOff; sample pod=%s-0", sb.ID))
		sb.transitionAt = at.UTC()
	}
	return sb, true
}

// bootstrapPath is the wrapper the Kubernetes runtime runs a sandbox's
// entrypoint with (the container's command is it and the entrypoint).
const bootstrapPath = "/opt/opensandbox/bootstrap.sh"

// sandboxJSON renders sb as a Sandbox (full) or a CreateSandboxResponse.
// The Kubernetes runtime answers a Sandbox from its BatchSandbox: the
// entrypoint is the container's command (bootstrapPath before the one
// asked for), createdAt the object's creationTimestamp (whole seconds);
// its create answer shows the entrypoint as asked and createdAt to the
// microsecond; its lastTransitionAt is always the creationTimestamp,
// whatever the state did since (docs/OPENSANDBOX-KUBERNETES.md).
func (s *Server) sandboxJSON(sb *sandbox, full bool) map[string]any {
	k8s := s.opts.runtime == Kubernetes
	entrypoint, created := sb.Entrypoint, sb.CreatedAt
	if k8s && full {
		entrypoint = append([]string{bootstrapPath}, sb.Entrypoint...)
		created = created.Truncate(time.Second)
	}
	status := statusJSON(sb)
	if k8s {
		status["lastTransitionAt"] = sb.CreatedAt.Truncate(time.Second).Format(time.RFC3339Nano)
	}
	v := map[string]any{
		"id":         sb.ID,
		"status":     status,
		"metadata":   sb.Metadata,
		"entrypoint": entrypoint,
		"createdAt":  created.Format(time.RFC3339Nano),
	}
	if !sb.expiresAt.IsZero() {
		v["expiresAt"] = sb.expiresAt.Format(time.RFC3339Nano)
	}
	if full && sb.Image != "" {
		v["image"] = map[string]any{"uri": sb.Image}
	}
	return v
}

// statusJSON renders sb's SandboxStatus.
func statusJSON(sb *sandbox) map[string]any {
	st := map[string]any{"state": sb.State, "reason": sb.Reason}
	if sb.Message != "" {
		st["message"] = sb.Message
	}
	if !sb.transitionAt.IsZero() {
		st["lastTransitionAt"] = sb.transitionAt.Format(time.RFC3339Nano)
	}
	return st
}

func jsonResponse(status int, v any) response {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sandboxapitest: marshal a response: %v", err)) // a bug of the fake
	}
	return response{status: status, body: b}
}

func errorResponse(status int, code, message string) response {
	return jsonResponse(status, map[string]string{"code": code, "message": message})
}

// notFound is the runtime's 404 for a sandbox that does not exist (or
// not any more).
func (s *Server) notFound(id string) response {
	resp := errorResponse(http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox %s not found.", id))
	if s.opts.runtime == Kubernetes {
		resp = errorResponse(http.StatusNotFound, "KUBERNETES::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox '%s' not found", id))
	}
	resp.missing = true
	return resp
}

// validationError is FastAPI's 422, which echoes the offending input.
func validationError(typ string, loc []any, msg string, input any) response {
	d := map[string]any{"type": typ, "loc": loc, "msg": msg}
	if input != nil {
		d["input"] = input
	}
	return jsonResponse(http.StatusUnprocessableEntity, map[string]any{"detail": []any{d}})
}

func faultResponse(f Fault) response {
	resp := errorResponse(f.Status, "FAKE::INJECTED_FAULT", "injected fault "+strconv.Itoa(f.Status))
	if f.RetryAfter > 0 {
		resp.header = http.Header{"Retry-After": {strconv.Itoa(f.RetryAfter)}}
	}
	return resp
}

// labelRules are the server's metadata rules (Kubernetes labels), written
// out here rather than shared with the client so that one cannot hide the
// other's mistake.
type labelRules struct {
	value, name, prefix *regexp.Regexp
}

func newLabelRules() labelRules {
	return labelRules{
		value:  regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`),
		name:   regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`),
		prefix: regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`),
	}
}

// checkMetadata applies the label rules to the keys and values of set and
// the keys of deleted.
func (lr labelRules) check(set map[string]string, deleted []string) error {
	keys := slices.Concat(slices.Sorted(maps.Keys(set)), deleted)
	for _, k := range keys {
		if strings.HasPrefix(k, "opensandbox.io/") {
			return fmt.Errorf("metadata key %q uses the reserved prefix opensandbox.io/", k)
		}
		name := k
		if prefix, rest, ok := strings.Cut(k, "/"); ok {
			if prefix == "" || len(prefix) > 253 || !lr.prefix.MatchString(prefix) {
				return fmt.Errorf("metadata key %q: prefix must be a lowercase DNS subdomain", k)
			}
			name = rest
		}
		if len(name) > 63 || !lr.name.MatchString(name) {
			return fmt.Errorf("metadata key %q: name must be at most 63 alphanumeric characters, '-', '_' or '.'", k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if v := set[k]; len(v) > 63 || !lr.value.MatchString(v) {
			return fmt.Errorf("metadata %q: value must be at most 63 characters matching %s", k, lr.value)
		}
	}
	return nil
}

func newSandboxID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "sbx-" + hex.EncodeToString(b)
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
