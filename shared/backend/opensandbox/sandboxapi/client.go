package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/internal/lifecycleapi"
)

// APIKeyHeader is the header that carries the API key.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// Options configure a Client.
type Options struct {
	// BaseURL is the server's address, such as "http://opensandbox:8080";
	// requests go to BaseURL/v1 (a BaseURL that already ends in /v1 is used
	// as it is).
	BaseURL string
	// APIKey is sent in APIKeyHeader; empty sends none (a server without a
	// key skips authentication).
	APIKey string
	// HTTPClient sends every request; nil means one with a 30 s timeout.
	HTTPClient *http.Client
	// Retry bounds the retries of idempotent requests (Get, List,
	// PatchMetadata, Delete). Create is never sent twice by this package:
	// whether a failed create took effect is for the caller to find out.
	Retry Retry
}

// Client talks to one OpenSandbox server. It is safe for concurrent use.
type Client struct {
	api   *lifecycleapi.Client
	retry Retry
}

// New returns a Client for o. The base URL must be an absolute http(s) URL.
func New(o Options) (*Client, error) {
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("opensandbox: base URL %q is not an absolute http(s) URL", o.BaseURL)
	}
	server := strings.TrimRight(o.BaseURL, "/")
	if !strings.HasSuffix(server, "/v1") {
		server += "/v1"
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	opts := []lifecycleapi.ClientOption{lifecycleapi.WithHTTPClient(hc)}
	if o.APIKey != "" {
		key := o.APIKey
		opts = append(opts, lifecycleapi.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set(APIKeyHeader, key)
			return nil
		}))
	}
	api, err := lifecycleapi.NewClient(server, opts...)
	if err != nil {
		return nil, fmt.Errorf("opensandbox: %w", err)
	}
	return &Client{api: api, retry: o.Retry}, nil
}

// Create asks for a new sandbox and returns the server's answer (state
// Pending). The request is checked first: metadata (ValidateMetadata), and
// either PoolRef or all of Image, Entrypoint and ResourceLimits. It is sent
// exactly once: after a Retryable error the sandbox may or may not exist.
// Env values the server quotes back in an error message are redacted.
func (c *Client) Create(ctx context.Context, r CreateRequest) (Sandbox, error) {
	body, err := r.body()
	if err != nil {
		return Sandbox{}, fmt.Errorf("opensandbox: create sandbox: %w", err)
	}
	data, err := c.send(ctx, false, func(ctx context.Context) (*http.Response, error) {
		return c.api.PostSandboxes(ctx, body)
	})
	if err != nil {
		redact(err, r.Env)
		return Sandbox{}, fmt.Errorf("opensandbox: create sandbox: %w", err)
	}
	var created lifecycleapi.CreateSandboxResponse
	if err := json.Unmarshal(data, &created); err != nil || created.Id == "" {
		return Sandbox{}, fmt.Errorf("opensandbox: create sandbox: the answer is not a sandbox (%v)", err)
	}
	return fromCreated(created), nil
}

// minRedacted is the shortest environment value redacted from an error:
// shorter ones ("1", "UTC") are no secrets and would garble the message.
const minRedacted = 6

// redact removes from the message of an *APIError every environment value
// the server may have quoted back (a validation message that names the
// offending value).
func redact(err error, env map[string]string) {
	var e *APIError
	if !errors.As(err, &e) {
		return
	}
	for _, v := range env {
		if len(v) >= minRedacted {
			e.Message = strings.ReplaceAll(e.Message, v, "[redacted]")
		}
	}
}

func (r CreateRequest) body() (lifecycleapi.CreateSandboxRequest, error) {
	var b lifecycleapi.CreateSandboxRequest
	if err := ValidateMetadata(r.Metadata); err != nil {
		return b, err
	}
	if r.PoolRef == "" {
		switch {
		case r.Image == "":
			return b, invalid("no image and no pool")
		case len(r.Entrypoint) == 0:
			return b, invalid("no entrypoint and no pool")
		case len(r.ResourceLimits) == 0:
			return b, invalid("no resource limits and no pool")
		}
	}
	if r.Timeout < 0 || (r.Timeout > 0 && r.Timeout < time.Minute) {
		return b, invalid("timeout %s is not zero or at least one minute", r.Timeout)
	}
	if r.PoolRef != "" {
		b.Extensions = &map[string]string{"poolRef": r.PoolRef}
	}
	if r.Image != "" {
		b.Image = &lifecycleapi.ImageSpec{Uri: r.Image}
	}
	if len(r.Entrypoint) > 0 {
		ep := append([]string(nil), r.Entrypoint...)
		b.Entrypoint = &ep
	}
	if len(r.ResourceLimits) > 0 {
		rl := lifecycleapi.ResourceLimits(maps.Clone(r.ResourceLimits))
		b.ResourceLimits = &rl
	}
	if r.Timeout > 0 {
		secs := int((r.Timeout + time.Second - 1) / time.Second)
		b.Timeout = &secs
	}
	if len(r.Env) > 0 {
		env := maps.Clone(r.Env)
		b.Env = &env
	}
	if len(r.Metadata) > 0 {
		md := maps.Clone(r.Metadata)
		b.Metadata = &md
	}
	return b, nil
}

// Get returns the sandbox id; a sandbox that does not exist (or no longer
// does) is an error for which IsNotFound is true.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	if id == "" {
		return Sandbox{}, errors.New("opensandbox: get sandbox: empty ID")
	}
	data, err := c.send(ctx, true, func(ctx context.Context) (*http.Response, error) {
		return c.api.GetSandboxesSandboxId(ctx, id)
	})
	if err != nil {
		return Sandbox{}, fmt.Errorf("opensandbox: get sandbox %s: %w", id, err)
	}
	return decodeSandbox("get sandbox "+id, data)
}

// maxPages stops a walk over pages that never ends (a server that always
// claims a next page): MaxPageSize times this is far beyond any installation.
const maxPages = 10000

// List returns every sandbox f selects, walking all pages in order. A
// sandbox is returned once even if the pages shift under concurrent creates
// and deletes; such a sandbox may also be missed, so a caller that must see
// everything lists again later (recover runs periodically).
func (c *Client) List(ctx context.Context, f ListFilter) ([]Sandbox, error) {
	size := f.PageSize
	if size == 0 {
		size = MaxPageSize
	}
	if size < 0 || size > MaxPageSize {
		return nil, fmt.Errorf("opensandbox: list sandboxes: page size %d is not within 1..%d", size, MaxPageSize)
	}
	var params lifecycleapi.GetSandboxesParams
	params.PageSize = &size
	if len(f.Metadata) > 0 {
		if err := ValidateMetadata(f.Metadata); err != nil {
			return nil, fmt.Errorf("opensandbox: list sandboxes: %w", err)
		}
		filter := MetadataFilter(f.Metadata)
		params.Metadata = &filter
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, s := range f.States {
			states[i] = string(s)
		}
		params.State = &states
	}
	var out []Sandbox
	seen := map[string]bool{}
	for page := 1; page <= maxPages; page++ {
		params.Page = &page
		data, err := c.send(ctx, true, func(ctx context.Context) (*http.Response, error) {
			return c.api.GetSandboxes(ctx, &params)
		})
		if err != nil {
			return nil, fmt.Errorf("opensandbox: list sandboxes, page %d: %w", page, err)
		}
		var resp lifecycleapi.ListSandboxesResponse
		if err := json.Unmarshal(data, &resp); err != nil {
			return nil, fmt.Errorf("opensandbox: list sandboxes, page %d: the answer is not a page (%v)", page, err)
		}
		for _, s := range resp.Items {
			if !seen[s.Id] {
				seen[s.Id] = true
				out = append(out, fromSandbox(s))
			}
		}
		if !resp.Pagination.HasNextPage || len(resp.Items) == 0 {
			return out, nil
		}
	}
	return nil, fmt.Errorf("opensandbox: list sandboxes: more than %d pages", maxPages)
}

// PatchMetadata applies patch to the metadata of sandbox id as an RFC 7396
// merge patch: a nil value deletes its key, other keys are set, keys not in
// patch are kept. The server does not lock: concurrent patches of the same
// key may lose one. It returns the sandbox as patched.
func (c *Client) PatchMetadata(ctx context.Context, id string, patch map[string]*string) (Sandbox, error) {
	if id == "" {
		return Sandbox{}, errors.New("opensandbox: patch sandbox metadata: empty ID")
	}
	body := make(lifecycleapi.PatchSandboxMetadataRequest, len(patch))
	set := map[string]string{}
	for k, v := range patch {
		if err := ValidateKey(k); err != nil {
			return Sandbox{}, fmt.Errorf("opensandbox: patch sandbox %s metadata: %w", id, err)
		}
		if v != nil {
			val := *v
			set[k] = val
			v = &val
		}
		body[k] = v
	}
	if err := ValidateMetadata(set); err != nil {
		return Sandbox{}, fmt.Errorf("opensandbox: patch sandbox %s metadata: %w", id, err)
	}
	data, err := c.send(ctx, true, func(ctx context.Context) (*http.Response, error) {
		return c.api.PatchSandboxesSandboxIdMetadata(ctx, id, body)
	})
	if err != nil {
		return Sandbox{}, fmt.Errorf("opensandbox: patch sandbox %s metadata: %w", id, err)
	}
	return decodeSandbox("patch sandbox "+id+" metadata", data)
}

// Delete deletes sandbox id. A sandbox that does not exist is deleted
// already: that is success.
func (c *Client) Delete(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("opensandbox: delete sandbox: empty ID")
	}
	_, err := c.send(ctx, true, func(ctx context.Context) (*http.Response, error) {
		return c.api.DeleteSandboxesSandboxId(ctx, id)
	})
	if err != nil && !IsNotFound(err) {
		return fmt.Errorf("opensandbox: delete sandbox %s: %w", id, err)
	}
	return nil
}

func decodeSandbox(op string, data []byte) (Sandbox, error) {
	var s lifecycleapi.Sandbox
	if err := json.Unmarshal(data, &s); err != nil || s.Id == "" {
		return Sandbox{}, fmt.Errorf("opensandbox: %s: the answer is not a sandbox (%v)", op, err)
	}
	return fromSandbox(s), nil
}

// maxBody bounds an answer read into memory.
const maxBody = 32 << 20

// send performs call, and again after a Retryable failure if idempotent
// (within c.retry), and returns the body of its 2xx answer.
func (c *Client) send(ctx context.Context, idempotent bool, call func(context.Context) (*http.Response, error)) ([]byte, error) {
	attempts := 1
	if idempotent {
		attempts = c.retry.MaxAttempts()
	}
	for n := 1; ; n++ {
		data, retryAfter, err := once(ctx, call)
		if err == nil {
			return data, nil
		}
		if n >= attempts || !Retryable(err) {
			return nil, err
		}
		if serr := Sleep(ctx, c.retry.Delay(n, retryAfter)); serr != nil {
			return nil, fmt.Errorf("%w (while retrying after: %w)", serr, err)
		}
	}
}

func once(ctx context.Context, call func(context.Context) (*http.Response, error)) ([]byte, time.Duration, error) {
	resp, err := call(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, 0, fmt.Errorf("read the answer: %w", err)
	}
	if len(data) > maxBody {
		return nil, 0, invalid("the answer is larger than %d bytes", maxBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, retryAfter(resp.Header.Get("Retry-After")), apiError(resp.StatusCode, data)
	}
	return data, 0, nil
}

// retryAfter reads a Retry-After of whole seconds; anything else is zero.
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
