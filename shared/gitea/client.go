// Package gitea speaks Gitea's runner protocol (runner.v1.RunnerService over
// Connect, under <root URL>api/actions) as one registered runner: one runner
// pool's registration, which may hold any number of running tasks.
//
// Only the registration that claimed a task may report on it, so every task
// must be reported through the Client of the pool that fetched it.
package gitea

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"gitea.dev/actions-proto-go/runner/v1/runnerv1connect"
)

// Version is what this runner declares to Gitea.
const Version = "gitea-dynamic-runner"

// capabilities are what every registration declares. Deliberately not
// "cancelling": with it, a cancelled task stays "cancelling" (and Gitea
// answers CANCELLED) until its runner reports, and recover, which deletes the
// executor of a task Gitea calls over, would kill the runner in the middle of
// that handshake and leave the task cancelling until the zombie reaper.
// Without it a cancel ends the task at once: the runner still sees it on its
// next heartbeat and stops, and its remaining log rows are still accepted.
var capabilities = []string{}

// Client is one registration's connection to Gitea. It is safe for
// concurrent use.
type Client struct {
	rpc   runnerv1connect.RunnerServiceClient
	creds Credentials
	// tasksVersion is the last tasks version Gitea answered with no task:
	// sent back, it lets Gitea answer "nothing new" from a counter instead
	// of looking for a job (0: look).
	tasksVersion atomic.Int64
}

// NewClient returns a client for the registration creds on the Gitea at
// rootURL (its ROOT_URL, such as https://gitea.example.com/).
func NewClient(rootURL string, hc *http.Client, creds Credentials) (*Client, error) {
	if creds.UUID == "" || creds.Token == "" {
		return nil, errors.New("gitea: runner credentials have no UUID or token")
	}
	endpoint, err := endpoint(rootURL)
	if err != nil {
		return nil, err
	}
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("x-runner-uuid", creds.UUID)
			req.Header().Set("x-runner-token", string(creds.Token))
			return next(ctx, req)
		}
	})
	return &Client{
		rpc:   runnerv1connect.NewRunnerServiceClient(httpClient(hc), endpoint, connect.WithInterceptors(auth)),
		creds: creds,
	}, nil
}

func httpClient(hc *http.Client) *http.Client {
	if hc == nil {
		return http.DefaultClient
	}
	return hc
}

func endpoint(rootURL string) (string, error) {
	u, err := url.Parse(rootURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("gitea: URL %q is not an absolute http(s) URL", rootURL)
	}
	if u.User != nil {
		return "", errors.New("gitea: the Gitea URL must not carry user information")
	}
	return strings.TrimSuffix(u.String(), "/") + "/api/actions", nil
}

// Credentials returns the registration the client acts as.
func (c *Client) Credentials() Credentials { return c.creds }

// Registration is what Register asks Gitea for.
type Registration struct {
	// Token is a runner registration token (instance, organisation, user or
	// repository scope bounds which jobs the runner can take).
	Token  string
	Name   string
	Labels []string
}

// Register registers a new non-ephemeral runner and returns its credentials.
func Register(ctx context.Context, rootURL string, hc *http.Client, r Registration) (Credentials, error) {
	endpoint, err := endpoint(rootURL)
	if err != nil {
		return Credentials{}, err
	}
	rpc := runnerv1connect.NewRunnerServiceClient(httpClient(hc), endpoint)
	res, err := rpc.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{
		Name: r.Name, Token: r.Token, Version: Version, Labels: r.Labels,
		Capabilities: capabilities,
	}))
	if err != nil {
		return Credentials{}, classify(ctx, "Register", err)
	}
	runner := res.Msg.GetRunner()
	if runner.GetUuid() == "" || runner.GetToken() == "" {
		return Credentials{}, errors.New("gitea: Register answered without runner credentials")
	}
	return Credentials{ID: runner.GetId(), UUID: runner.GetUuid(), Token: Token(runner.GetToken()), Name: runner.GetName()}, nil
}

// Declare sets the runner's labels and capabilities. Gitea overwrites both
// with what is sent, so every call sends the full set (and so switches off a
// "cancelling" an older registration had).
func (c *Client) Declare(ctx context.Context, labels []string) error {
	_, err := c.rpc.Declare(ctx, connect.NewRequest(&runnerv1.DeclareRequest{
		Version: Version, Labels: labels, Capabilities: capabilities,
	}))
	return classify(ctx, "Declare", err)
}

// FetchTask claims the oldest waiting job the runner's labels match, or
// returns nil when there is none. A claimed task is running in Gitea from
// this moment: it must be persisted, or it is lost until Gitea's zombie
// reaper fails it.
//
// It sends the tasks version of its last answer, as Gitea's own runner
// does: Gitea bumps its version whenever a job may have become runnable
// (queued, unblocked), and answers a runner that already has the latest
// version with no task and without looking, which makes polling cheap. After
// a task, and on a version Gitea did not advance (a throttled pick), the
// next call looks again.
func (c *Client) FetchTask(ctx context.Context) (*runnerv1.Task, error) {
	sent := c.tasksVersion.Load()
	res, err := c.rpc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{TasksVersion: sent}))
	if err != nil {
		return nil, classify(ctx, "FetchTask", err)
	}
	if task := res.Msg.GetTask(); task != nil {
		// There may be more: look again next time, whatever the version.
		c.tasksVersion.Store(0)
		return task, nil
	}
	if v := res.Msg.GetTasksVersion(); v > sent {
		c.tasksVersion.CompareAndSwap(sent, v)
	}
	return nil, nil
}

// UpdateTask sends a task's state (a heartbeat when its result is
// UNSPECIFIED) and returns Gitea's view of it.
func (c *Client) UpdateTask(ctx context.Context, req *runnerv1.UpdateTaskRequest) (*runnerv1.UpdateTaskResponse, error) {
	res, err := c.rpc.UpdateTask(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, classify(ctx, "UpdateTask", err)
	}
	return res.Msg, nil
}

// UpdateLog appends log rows to a task and returns the acknowledged row count.
func (c *Client) UpdateLog(ctx context.Context, req *runnerv1.UpdateLogRequest) (*runnerv1.UpdateLogResponse, error) {
	res, err := c.rpc.UpdateLog(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, classify(ctx, "UpdateLog", err)
	}
	return res.Msg, nil
}
