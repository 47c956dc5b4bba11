// Package sandboxapitest is a fake OpenSandbox lifecycle server for tests:
// in memory, on 127.0.0.1, and strict.
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
// afterwards, the `metadata` filter and repeated `state` filter of the list,
// and merge-patch metadata where null deletes. A request the real server
// would refuse is refused here too, so the fake cannot hide a client bug.
//
// Tests drive what a real server decides on its own: state transitions
// (SetState, Transition), faults (Inject, FailNext: 429 or 5xx, before or
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

	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	seq        int
	creates    int
	calls      map[string]int
	faults     []Fault
	faultFunc  func(method, path string) *Fault
	created    []Sandbox
	latency    time.Duration
	rejections []Rejection
}

// Option configures New.
type Option func(*options)

type options struct{ apiKey string }

// WithAPIKey makes the fake require key in OPEN-SANDBOX-API-KEY, answering
// 401 without it. By default, like a real server started without a key, it
// accepts every request.
func WithAPIKey(key string) Option { return func(o *options) { o.apiKey = key } }

// New starts a fake on 127.0.0.1 and stops it when t ends.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{t: t, rules: newLabelRules(), sandboxes: map[string]*sandbox{}, calls: map[string]int{}}
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
	ID             string
	State          string
	Reason         string
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
	seq       int
	expiresAt time.Time
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
	sb, ok := s.sandboxes[id]
	if ok {
		sb.State, sb.Reason = state, "test_transition"
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
	sb, ok := s.sandboxes[id]
	if !ok {
		s.t.Fatalf("sandboxapitest: SetState: no sandbox %q", id)
	}
	sb.State, sb.Reason = state, "test_transition"
}

// SetMetadata writes one metadata key of sandbox id directly, bypassing
// every rule (nil deletes it): how a test tampers with metadata.
func (s *Server) SetMetadata(id, key string, value *string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
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
	resp := s.create(body)
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

// Sandbox returns sandbox id, false if it does not exist (or was deleted).
func (s *Server) Sandbox(id string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return Sandbox{}, false
	}
	s.expire(sb)
	return sb.snapshot(), true
}

// Sandboxes returns every existing sandbox, oldest first.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Sandbox, 0, len(s.sandboxes))
	for _, sb := range s.ordered() {
		s.expire(sb)
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
		// No operation: FastAPI's own answer, outside the specification.
		status, detail := http.StatusNotFound, "Not Found"
		if errors.Is(verr, routers.ErrMethodNotAllowed) {
			status, detail = http.StatusMethodNotAllowed, "Method Not Allowed"
		}
		s.reject(Rejection{Method: r.Method, Path: r.URL.Path, Status: status, Reason: verr.Error()})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"detail": detail})
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
		if errors.As(verr, &sec) {
			resp = errorResponse(http.StatusUnauthorized, "UNAUTHORIZED", "missing or invalid API key")
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
		return s.create(body)
	case "GET /sandboxes/{sandboxId}":
		sb, ok := s.sandboxes[id]
		if !ok {
			return notFound(id)
		}
		s.expire(sb)
		return jsonResponse(http.StatusOK, sandboxJSON(sb, true))
	case "DELETE /sandboxes/{sandboxId}":
		if _, ok := s.sandboxes[id]; !ok {
			return notFound(id)
		}
		delete(s.sandboxes, id)
		return response{status: http.StatusNoContent}
	case "PATCH /sandboxes/{sandboxId}/metadata":
		return s.patch(id, body)
	}
	return errorResponse(http.StatusInternalServerError, "FAKE::NOT_IMPLEMENTED", op+" is not implemented by the fake")
}

func (s *Server) create(body []byte) response {
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
	s.seq++
	s.creates++
	sb := &sandbox{seq: s.seq, Sandbox: Sandbox{
		ID:             newSandboxID(),
		State:          "Pending",
		Reason:         "SANDBOX_SCHEDULED",
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
	s.sandboxes[sb.ID] = sb
	s.created = append(s.created, sb.snapshot())
	resp := jsonResponse(http.StatusAccepted, sandboxJSON(sb, false))
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
		s.expire(sb)
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
			items = append(items, sandboxJSON(sb, true))
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
	sb, ok := s.sandboxes[id]
	if !ok {
		return notFound(id)
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
	s.expire(sb)
	return jsonResponse(http.StatusOK, sandboxJSON(sb, true))
}

// ordered returns the sandboxes oldest first. s.mu is held.
func (s *Server) ordered() []*sandbox {
	out := slices.Collect(maps.Values(s.sandboxes))
	slices.SortFunc(out, func(a, b *sandbox) int { return a.seq - b.seq })
	return out
}

// expire terminates a sandbox whose timeout passed, as the server does.
// s.mu is held.
func (s *Server) expire(sb *sandbox) {
	if !sb.expiresAt.IsZero() && time.Now().After(sb.expiresAt) && sb.State != "Terminated" && sb.State != "Failed" {
		sb.State, sb.Reason = "Terminated", "ttl_expiry"
	}
}

// sandboxJSON renders sb as a Sandbox (full) or a CreateSandboxResponse.
func sandboxJSON(sb *sandbox, full bool) map[string]any {
	v := map[string]any{
		"id":         sb.ID,
		"status":     map[string]any{"state": sb.State, "reason": sb.Reason},
		"metadata":   sb.Metadata,
		"entrypoint": sb.Entrypoint,
		"createdAt":  sb.CreatedAt.Format(time.RFC3339Nano),
	}
	if !sb.expiresAt.IsZero() {
		v["expiresAt"] = sb.expiresAt.Format(time.RFC3339Nano)
	}
	if full && sb.Image != "" {
		v["image"] = map[string]any{"uri": sb.Image}
	}
	return v
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

func notFound(id string) response {
	resp := errorResponse(http.StatusNotFound, "SANDBOX::NOT_FOUND", fmt.Sprintf("sandbox %s not found", id))
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
