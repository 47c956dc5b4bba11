// Package gateway lets an executor speak Gitea's runner protocol for its own
// task and nothing else, and use its own repository's actions cache (see
// cacheScoped). The executor never holds a runner token: the
// gateway forwards its calls with the credentials of the pool that claimed
// the task, after authenticating the caller twice:
//
//   - SPIFFE mTLS: the caller's task comes from its verified X.509-SVID
//     (spiffe://<td>/repo/<owner>/<name>/task/<id>), never from a request;
//   - the capability (bootstrap.Verify) over (assignment ID, task ID, SPIFFE
//     ID), sent in headers.
//
// It is stateless: any replica serves any executor.
package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// The headers an executor authenticates with, besides its SVID.
const (
	HeaderAssignment = "X-Gdr-Assignment-Id"
	HeaderCapability = "X-Gdr-Capability"
)

// MaxRequestBytes caps the body of every request: well above the largest
// UpdateLog a runner sends (act_runner batches rows of a few KiB), far below
// what would let one executor exhaust the gateway's memory.
const MaxRequestBytes = 4 << 20

// Forwarder is a pool's registration toward Gitea (gitea.Client).
type Forwarder interface {
	UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error)
	UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error)
}

// Payloads is where the claimed tasks are (assignmentqueue.Payloads).
type Payloads interface {
	Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error)
	MarkStarted(ctx context.Context, assignmentID string) error
	// Unmark removes assignmentID's started mark.
	Unmark(ctx context.Context, assignmentID string) error
	// Started reports whether MarkStarted was called for assignmentID.
	Started(ctx context.Context, assignmentID string) (bool, error)
}

// Observer hears of every task handed to its executor and of every final
// result Gitea accepted from one (metrics). Safe for concurrent use, quick.
type Observer interface {
	// Started: pool's task waited that long from its claim (its payload
	// stored) to its executor's FetchTask. Called once per FetchTask
	// answered: normally once a task, again when a runner retries.
	Started(pool string, waited time.Duration)
	// Finished: Gitea accepted pool's task's final result; ran is what the
	// runner reported as its run (started_at to stopped_at), 0 when it
	// reported no such span. Called once per final UpdateTask Gitea
	// accepted: normally once a task, again when a runner retries it.
	Finished(pool string, result runnerv1.Result, ran time.Duration)
}

// storedAter is read of Payloads for an Observer, when it has it
// (assignmentqueue.Payloads): when a payload was stored.
type storedAter interface {
	StoredAt(ctx context.Context, assignmentID string) (time.Time, error)
}

// Verifier checks capabilities (bootstrap.Bootstrap).
type Verifier interface {
	Verify(assignmentID string, taskID int64, spiffeID, capability string) error
}

// Notifier publishes finish notices (assignmentqueue.Finished).
type Notifier interface {
	Publish(ctx context.Context, b taskassignment.BackendKind, assignmentID string) error
}

// Gateway serves executors.
type Gateway struct {
	TrustDomain spiffeid.TrustDomain
	// Pools maps a pool name to its registration.
	Pools        map[string]Forwarder
	Payloads     Payloads
	Capabilities Verifier
	Log          *slog.Logger
	// Finished, if set, is told of every task whose final result Gitea
	// accepted from its executor (see UpdateTask); Backends maps each pool
	// to its backend, which the notice is addressed to. Nil: no notices, and
	// recover's periodic pass finds every finished executor.
	Finished Notifier
	Backends map[string]taskassignment.BackendKind
	// Observer, if set, hears of every task handed to its executor.
	Observer Observer
	// Cache, if set, is served under actionscache.PathPrefix to each
	// executor for its own repository (see cacheScoped).
	Cache *actionscache.Cache

	// bindings saves the payload read behind every UpdateTask and UpdateLog
	// once a caller is bound to its task (see bound).
	bindings bindings
	// inFlight counts each peer's requests in flight (perPeer).
	inFlight inFlight
	// conns counts each peer's open connections (perPeer, TrackConnections).
	conns peerConns
}

// MaxRequestsPerPeer caps the requests one executor (one SPIFFE ID) has in
// flight at once: a runner sends a few (its log, its state, a cache
// transfer or two), and one that opens many more, or never reads its
// answers, cannot take the gateway's goroutines and descriptors from every
// other executor. Past it a request is answered 429 at once, unread.
const MaxRequestsPerPeer = 16

// inFlight counts requests in flight by peer; the zero value is ready.
type inFlight struct {
	mu    sync.Mutex
	peers map[string]int
}

// acquire counts one more request of peer unless it has max in flight.
func (f *inFlight) acquire(peer string, max int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peers[peer] >= max {
		return false
	}
	if f.peers == nil {
		f.peers = map[string]int{}
	}
	f.peers[peer]++
	return true
}

func (f *inFlight) release(peer string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peers[peer]--; f.peers[peer] <= 0 {
		delete(f.peers, peer) // the map holds the peers with requests in flight only
	}
}

// perPeer admits a request while its TLS peer has fewer than
// MaxRequestsPerPeer in flight, on one of at most MaxConnectionsPerPeer
// connections (with TrackConnections); any other is answered 429 before
// anything of it is read, and its connection closed. A request without a
// peer identity counts under "", and is refused by authentication after.
func (g *Gateway) perPeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var peer string
		if id := peerID(r); id != nil {
			peer = id.String()
		}
		if !g.admitConn(r, peer) {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Connection", "close")
			http.Error(w, "too many connections from this executor", http.StatusTooManyRequests)
			return
		}
		if !g.inFlight.acquire(peer, MaxRequestsPerPeer) {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Connection", "close") // an unread body is not drained
			http.Error(w, "too many requests in flight from this executor", http.StatusTooManyRequests)
			return
		}
		defer g.inFlight.release(peer)
		next.ServeHTTP(w, r)
	})
}

// maxBindings bounds the bindings a gateway remembers: well above the jobs
// one replica serves at once; past it the memory starts afresh.
const maxBindings = 8192

// bindings remembers the (assignment, SPIFFE ID) pairs bound already. A
// payload never changes once stored, so a pair bound once stays bound: a
// runner's log and state reports, every second or so, then cost no payload
// read and decryption. Only successes are remembered; a refused caller is
// checked against the payload every time. A task whose payload was deleted
// since (it is over) is still forwarded, and Gitea keeps its final state.
type bindings struct {
	mu   sync.Mutex
	seen map[string]string // assignment ID -> the SPIFFE ID bound to it
}

func (b *bindings) has(c caller) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	id, ok := b.seen[c.assignmentID]
	return ok && id == c.spiffeID
}

func (b *bindings) add(c caller) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil || len(b.seen) >= maxBindings {
		b.seen = make(map[string]string)
	}
	b.seen[c.assignmentID] = c.spiffeID
}

// Authorizer accepts, at the TLS handshake, exactly the task identities of
// the trust domain: spiffe://<td>/repo/...
func (g *Gateway) Authorizer() tlsconfig.Authorizer {
	return func(id spiffeid.ID, _ [][]*x509.Certificate) error {
		if !id.MemberOf(g.TrustDomain) || !strings.HasPrefix(id.Path(), "/repo/") {
			return fmt.Errorf("gateway: %s is not a task identity of %q", id, g.TrustDomain.Name())
		}
		return nil
	}
}

// Handler returns the HTTP handler to serve behind a TLS listener configured
// with tlsconfig.MTLSServerConfig(svid, bundle, g.Authorizer()). A request is
// authenticated from its TLS peer and headers before any byte of its body is
// read: a caller without a valid SVID and capability cannot make the gateway
// read, decode or buffer a body, whatever its size. With a Cache it also
// serves the cache protocol under actionscache.PathPrefix, authenticated the
// same way; serve it with a body cap of MaxBodyBytes.
func (g *Gateway) Handler() http.Handler {
	path, h := runnerv1connect.NewRunnerServiceHandler(service{g}, connect.WithReadMaxBytes(MaxRequestBytes))
	mux := http.NewServeMux()
	mux.Handle(path, g.perPeer(http.MaxBytesHandler(g.authenticated(h), MaxRequestBytes)))
	if g.Cache != nil {
		mux.Handle(actionscache.PathPrefix, g.perPeer(g.cacheScoped(actionscache.Handler(g.Cache, g.log()))))
	}
	return mux
}

type callerKey struct{}

// authenticated admits a request whose TLS peer and headers authenticate
// (see authenticate), with its caller in the context; any other is answered
// with the protocol's error at once.
func (g *Gateway) authenticated(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := g.authenticate(peerID(r), r.Header)
		if err != nil {
			_ = errs.Write(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// peerID is the SPIFFE ID of r's TLS peer (its leaf certificate, which the
// TLS handshake verified against the trust bundle), or nil when r came with
// no client certificate or one without a SPIFFE ID.
func peerID(r *http.Request) *spiffeid.ID {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	id, err := x509svid.IDFromCert(r.TLS.PeerCertificates[0])
	if err != nil {
		return nil
	}
	return &id
}

// callerOf returns the caller authenticated reaches the service with.
func callerOf(ctx context.Context) (caller, error) {
	c, ok := ctx.Value(callerKey{}).(caller)
	if !ok {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("not authenticated"))
	}
	return c, nil
}

// caller is an authenticated executor.
type caller struct {
	assignmentID string
	pool         string
	taskID       int64
	spiffeID     string
}

// authenticate checks both factors. Unauthenticated (401) when a factor is
// missing or wrong; nothing in the error comes from the capability.
func (g *Gateway) authenticate(peer *spiffeid.ID, h http.Header) (caller, error) {
	if peer == nil {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, errors.New("no verified client certificate"))
	}
	id := *peer
	_, taskID, err := taskidentity.Parse(g.TrustDomain, id)
	if err != nil {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	assignmentID, capability := h.Get(HeaderAssignment), h.Get(HeaderCapability)
	if assignmentID == "" || capability == "" {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("missing %s or %s", HeaderAssignment, HeaderCapability))
	}
	pool, idTask, err := taskassignment.ParseID(assignmentID)
	if err != nil || idTask != taskID {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("assignment %q is not task %d's", assignmentID, taskID))
	}
	if err := g.Capabilities.Verify(assignmentID, taskID, id.String(), capability); err != nil {
		return caller{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("assignment %s: %w", assignmentID, err))
	}
	return caller{assignmentID: assignmentID, pool: pool, taskID: taskID, spiffeID: id.String()}, nil
}

func (g *Gateway) log() *slog.Logger {
	if g.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Log
}

func (g *Gateway) forwarder(c caller) (Forwarder, error) {
	f, ok := g.Pools[c.pool]
	if !ok {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("pool %q is not served here", c.pool))
	}
	return f, nil
}

// fromGitea passes Gitea's answer through with its real code and message.
func fromGitea(err error) error {
	var e *gitea.Error
	if errors.As(err, &e) {
		return connect.NewError(e.Code, errors.New(e.Message))
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// bound returns the caller's task from its sealed payload, after checking
// that the task is exactly the caller's: the SPIFFE ID derived from the
// payload itself (its repository and task) must equal the caller's verified
// one, in full. A forged assignment can give an executor a valid SVID and
// capability for another repository with this task's ID; it still gets 403.
func (g *Gateway) bound(ctx context.Context, c caller) (*runnerv1.Task, error) {
	task, err := g.Payloads.Get(ctx, c.assignmentID)
	if errors.Is(err, taskassignment.ErrPayloadNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("task %d is over or unknown", c.taskID))
	}
	if err != nil {
		g.log().Error("payload unavailable", slog.String("assignment", c.assignmentID), slog.Any("error", err))
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("task %d: payload unavailable", c.taskID))
	}
	if task.GetId() != c.taskID {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("the payload of %s holds another task", c.assignmentID))
	}
	owner, err := taskidentity.FromTask(g.TrustDomain, task)
	if err != nil || owner.SPIFFEID != c.spiffeID {
		g.log().Warn("executor refused: its identity is not the task's", slog.String("assignment", c.assignmentID),
			slog.String("caller", c.spiffeID))
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("task %d is not the task of %s", c.taskID, c.spiffeID))
	}
	g.bindings.add(c)
	return task, nil
}

// forwarderFor returns the registration to forward a call about taskID
// with, once the caller is known to be that task's own executor (see bound).
func (g *Gateway) forwarderFor(ctx context.Context, taskID int64) (Forwarder, error) {
	c, err := callerOf(ctx)
	if err != nil {
		return nil, err
	}
	if taskID != c.taskID {
		return nil, notYours(c, taskID)
	}
	if !g.bindings.has(c) {
		if _, err := g.bound(ctx, c); err != nil {
			return nil, err
		}
	}
	return g.forwarder(c)
}

func notYours(c caller, taskID int64) error {
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("task %d is not the task of %s", taskID, c.spiffeID))
}

// service implements the runner service for executors.
type service struct{ g *Gateway }

var _ runnerv1connect.RunnerServiceHandler = service{}

func (service) Register(context.Context, *connect.Request[runnerv1.RegisterRequest]) (*connect.Response[runnerv1.RegisterResponse], error) {
	return nil, connect.NewError(connect.CodePermissionDenied, errors.New("executors do not register"))
}

func (service) Declare(context.Context, *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	return nil, connect.NewError(connect.CodePermissionDenied, errors.New("executors do not declare"))
}

// FetchTask returns the caller's own task, every time it asks while Gitea
// runs it, and marks it started (from then on dispatch stops its keep-alive
// heartbeats). A task fetched before and ended since is refused
// (FailedPrecondition): a runner started again in the same executor (an
// OpenSandbox sandbox on Kubernetes, whose Pod restarts its container after
// the runner exits) must not run a finished job a second time in the
// moments before recover deletes the payload.
func (s service) FetchTask(ctx context.Context, req *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	c, err := callerOf(ctx)
	if err != nil {
		return nil, err
	}
	task, err := s.g.bound(ctx, c)
	if err != nil {
		return nil, err
	}
	if err := s.g.refuseEnded(ctx, c); err != nil {
		return nil, err
	}
	if err := s.g.Payloads.MarkStarted(ctx, c.assignmentID); err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("task %d: %w", c.taskID, err))
	}
	if err := s.g.stillBound(ctx, c); err != nil {
		return nil, err
	}
	s.g.log().Info("task handed to its executor", slog.String("assignment", c.assignmentID), slog.Int64("task", c.taskID))
	s.g.observeStarted(ctx, c)
	return connect.NewResponse(&runnerv1.FetchTaskResponse{Task: task}), nil
}

// stillBound closes the window between FetchTask's read of the payload and
// its started mark: recover may have ended the task and deleted the payload
// and its marks in between, and the mark put after that delete would be
// left without its payload for ever (recover passes over payloads). Read
// after the mark, a payload gone means that delete came first: the mark is
// removed and the fetch refused as over. A payload still there means the
// delete, if any, comes after, and assignmentqueue's Delete removes the
// started mark again after the payload.
func (g *Gateway) stillBound(ctx context.Context, c caller) error {
	_, err := g.Payloads.Get(ctx, c.assignmentID)
	if !errors.Is(err, taskassignment.ErrPayloadNotFound) {
		return nil // there, or unreadable: the mark goes with the payload
	}
	if err := g.Payloads.Unmark(ctx, c.assignmentID); err != nil {
		g.log().Error("started mark left after its payload", slog.String("assignment", c.assignmentID), slog.Any("error", err))
	}
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("task %d is over or unknown", c.taskID))
}

// refuseEnded refuses a fetch of a task fetched before (its started mark)
// that Gitea has ended. A first fetch costs nothing more; a second asks
// Gitea with a bare heartbeat, which a finished task answers with its
// result and leaves as it is.
func (g *Gateway) refuseEnded(ctx context.Context, c caller) error {
	started, err := g.Payloads.Started(ctx, c.assignmentID)
	if err != nil {
		g.log().Error("started mark unavailable", slog.String("assignment", c.assignmentID), slog.Any("error", err))
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("task %d: payload unavailable", c.taskID))
	}
	if !started {
		return nil
	}
	f, err := g.forwarder(c)
	if err != nil {
		return err
	}
	res, err := f.UpdateTask(ctx, &runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{Id: c.taskID}})
	if err != nil {
		return fromGitea(err)
	}
	if result := res.GetState().GetResult(); result != runnerv1.Result_RESULT_UNSPECIFIED {
		g.log().Warn("executor refused: it fetched its task again after the task ended", slog.String("assignment", c.assignmentID),
			slog.String("result", result.String()))
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("task %d has ended (%s): it is not run again", c.taskID, result))
	}
	return nil
}

// UpdateTask forwards the caller's own task state; any other task is 403.
// Once Gitea has accepted the final result (a result set), it publishes the
// task's finish notice (see notifyFinished).
func (s service) UpdateTask(ctx context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	f, err := s.g.forwarderFor(ctx, req.Msg.GetState().GetId())
	if err != nil {
		return nil, err
	}
	res, err := f.UpdateTask(ctx, req.Msg)
	if err != nil {
		return nil, fromGitea(err)
	}
	if req.Msg.GetState().GetResult() != runnerv1.Result_RESULT_UNSPECIFIED {
		s.g.observeFinished(ctx, req.Msg.GetState())
		s.g.notifyFinished(ctx, req.Msg.GetState().GetId())
	}
	return connect.NewResponse(res), nil
}

// noticeTimeout bounds the publish of one finish notice.
const noticeTimeout = 5 * time.Second

// notifyFinished publishes the finish notice of the caller's task, whose
// final result Gitea has just accepted, so that recover reports and deletes
// its executor and frees its slot at once. It runs before UpdateTask answers,
// on a context detached from the caller's (a runner that hangs up after its
// final report still gets its notice), bounded by noticeTimeout.
//
// A failure is logged and never fails the UpdateTask: Gitea holds the result,
// and recover's periodic pass is the safety net for a notice that is lost
// here or by a crash between Gitea's answer and the publish. A runner that
// reports its final result twice publishes the same Nats-Msg-Id twice: one
// notice within the stream's duplicate window.
func (g *Gateway) notifyFinished(ctx context.Context, taskID int64) {
	if g.Finished == nil {
		return
	}
	c, err := callerOf(ctx)
	if err != nil {
		return
	}
	log := g.log().With(slog.String("assignment", c.assignmentID), slog.Int64("task", taskID))
	b, ok := g.Backends[c.pool]
	if !ok {
		log.Warn("finish notice not sent: the pool's backend is not known here", slog.String("pool", c.pool))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), noticeTimeout)
	defer cancel()
	if err := g.Finished.Publish(ctx, b, c.assignmentID); err != nil {
		log.Warn("finish notice not sent; recover's next pass finishes the executor", slog.Any("error", err))
		return
	}
	log.Info("finish notice sent", slog.String("backend", string(b)))
}

// UpdateLog forwards the caller's own log rows; any other task is 403.
func (s service) UpdateLog(ctx context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	f, err := s.g.forwarderFor(ctx, req.Msg.GetTaskId())
	if err != nil {
		return nil, err
	}
	res, err := f.UpdateLog(ctx, req.Msg)
	if err != nil {
		return nil, fromGitea(err)
	}
	return connect.NewResponse(res), nil
}

// observeFinished tells the Observer of the final result st Gitea has just
// accepted from the caller, and how long the runner says the job ran. The
// span is the executor's own word: a compromised one can skew only its own
// observation, and a negative or missing span counts as 0.
func (g *Gateway) observeFinished(ctx context.Context, st *runnerv1.TaskState) {
	if g.Observer == nil {
		return
	}
	c, err := callerOf(ctx)
	if err != nil {
		return
	}
	var ran time.Duration
	if st.GetStartedAt() != nil && st.GetStoppedAt() != nil {
		ran = max(st.GetStoppedAt().AsTime().Sub(st.GetStartedAt().AsTime()), 0)
	}
	g.Observer.Finished(c.pool, st.GetResult(), ran)
}

// observeStarted tells the Observer how long c's task waited for its
// executor; a payload whose store time cannot be read is not observed.
func (g *Gateway) observeStarted(ctx context.Context, c caller) {
	if g.Observer == nil {
		return
	}
	sa, ok := g.Payloads.(storedAter)
	if !ok {
		return
	}
	at, err := sa.StoredAt(ctx, c.assignmentID)
	if err != nil {
		return
	}
	g.Observer.Started(c.pool, max(time.Since(at), 0))
}
