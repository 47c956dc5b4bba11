package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gateway"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/reporter"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/stepdocker"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/taskrun"
)

func run(ctx context.Context, cfg Config, v values, log *slog.Logger) int {
	id, err := spiffeid.FromString(v.SPIFFEID)
	if err != nil {
		log.Error("bad SPIFFE ID", slog.Any("error", err))
		return 2
	}
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	svid, bundle, closeSource, err := identity(startCtx, v, id)
	if err != nil {
		log.Error("no identity", slog.Any("error", err))
		return 2
	}
	defer closeSource()
	creds := gateway.Credentials{SVID: svid, Bundle: bundle, AssignmentID: v.AssignmentID, Capability: v.Capability}
	server := tlsconfig.AuthorizeID(v.GatewayID) // the gateway itself, not any member of the trust domain
	client := gateway.NewClient(v.GatewayURL, creds, server)
	task, err := fetch(startCtx, client, log)
	if err != nil {
		log.Error("no task", slog.Any("error", err))
		return 2
	}
	if task.GetId() != v.TaskID {
		log.Error("the gateway handed out another task", slog.Int64("got", task.GetId()))
		return 2
	}
	// The job's cache calls go to the gateway over this executor's own
	// mTLS connection; without a proxy, actions/cache warns and caches
	// nothing, and the job runs on.
	var cacheURL string
	if proxy, err := actionscache.StartProxy(v.GatewayURL, gateway.NewTransport(creds, server), log); err != nil {
		log.Warn("no cache proxy", slog.Any("error", err))
	} else {
		defer proxy.Close()
		cacheURL = proxy.URL
	}
	return execute(ctx, cfg, v, protocol{client}, task, cacheURL, log)
}

// execute runs the task and reports it; the exit status says whether the
// result reached Gitea.
func execute(ctx context.Context, cfg Config, v values, c reporter.Client, task *runnerv1.Task, cacheURL string, log *slog.Logger) int {
	host := v.host()
	if daemon, err := stepdocker.Find(ctx); err != nil {
		host.NoDocker = err.Error()
	} else {
		host.Docker = daemon
	}
	job, prepErr := taskrun.Prepare(task, host)
	steps := 0
	if prepErr == nil {
		steps = job.Steps()
	}
	rep := reporter.New(ctx, c, task, steps, reporter.Options{})
	rep.Start()
	var lastWords string
	if prepErr != nil {
		lastWords = prepErr.Error()
	} else {
		dir := taskrun.TaskDir(cfg.WorkDir, task.GetId())
		err := job.Run(ctx, rep, taskrun.Options{WorkDir: dir + "/work", CacheDir: dir + "/cache", CacheURL: cacheURL})
		var ue *taskrun.UnsupportedError
		if errors.As(err, &ue) || (err != nil && rep.JobContext().Err() == nil) {
			lastWords = err.Error()
		}
	}
	if err := rep.Close(lastWords); err != nil {
		log.Error("the result did not reach Gitea", slog.Any("error", err))
		return 1
	}
	log.Info("task reported", slog.String("result", rep.Result().String()))
	return 0
}

// identity returns the executor's SVID and trust bundle: handed over in the
// bootstrap values, or from the Workload API, which may take a moment to
// know the executor (its registration entry propagates).
func identity(ctx context.Context, v values, id spiffeid.ID) (x509svid.Source, x509bundle.Source, func(), error) {
	if v.SVIDCert != "" {
		svid, err := x509svid.Parse([]byte(v.SVIDCert), []byte(v.SVIDKey))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("handed-over SVID: %w", err)
		}
		bundle, err := x509bundle.Parse(id.TrustDomain(), []byte(v.SVIDBundle))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("handed-over bundle: %w", err)
		}
		if svid.ID != id {
			return nil, nil, nil, fmt.Errorf("the handed-over SVID is %s, not %s", svid.ID, id)
		}
		return svid, bundle, func() {}, nil
	}
	// The agent answers "no identity issued" until the executor's entry
	// reaches it (its next sync after handle registered the entry); the
	// client's default backoff (1 s, 2 s, 3 s, ...) would add up to seconds
	// after that. The agent is local: ask again every identityRetry.
	clientOpts := []workloadapi.ClientOption{workloadapi.WithBackoffStrategy(constantBackoff(identityRetry))}
	if v.Socket != "" {
		clientOpts = append(clientOpts, workloadapi.WithAddr(v.Socket))
	}
	opts := []workloadapi.X509SourceOption{workloadapi.WithClientOptions(clientOpts...)}
	opts = append(opts, workloadapi.WithDefaultX509SVIDPicker(func(svids []*x509svid.SVID) *x509svid.SVID {
		for _, s := range svids {
			if s.ID == id {
				return s
			}
		}
		return svids[0]
	}))
	for {
		src, err := workloadapi.NewX509Source(ctx, opts...)
		if err == nil {
			got, err := src.GetX509SVID()
			if err == nil && got.ID == id {
				return src, src, func() { _ = src.Close() }, nil
			}
			_ = src.Close()
		}
		select {
		case <-ctx.Done():
			return nil, nil, nil, fmt.Errorf("SPIFFE Workload API: no SVID for %s: %w", id, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// identityRetry is how often the runner asks the Workload API again while
// it has no SVID for the executor.
const identityRetry = 200 * time.Millisecond

// constantBackoff is a workloadapi.BackoffStrategy that always waits d.
type constantBackoff time.Duration

func (b constantBackoff) NewBackoff() workloadapi.Backoff { return b }
func (b constantBackoff) Next() time.Duration             { return time.Duration(b) }
func (constantBackoff) Reset()                            {}

// fetch asks the gateway for the task, retrying while it is unreachable.
func fetch(ctx context.Context, c runnerv1connect.RunnerServiceClient, log *slog.Logger) (*runnerv1.Task, error) {
	for {
		res, err := c.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
		if err == nil {
			if res.Msg.GetTask() == nil {
				return nil, errors.New("the gateway answered without a task")
			}
			return res.Msg.GetTask(), nil
		}
		switch connect.CodeOf(err) {
		case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown:
		default:
			return nil, err
		}
		log.Warn("gateway unreachable; retrying", slog.Any("error", err))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fetch task: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// protocol adapts the connect client to reporter.Client.
type protocol struct {
	c runnerv1connect.RunnerServiceClient
}

func (p protocol) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	res, err := p.c.UpdateTask(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func (p protocol) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	res, err := p.c.UpdateLog(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}
