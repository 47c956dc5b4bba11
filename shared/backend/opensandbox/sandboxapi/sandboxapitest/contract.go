package sandboxapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi/spec"
)

// contract checks requests and responses against the lifecycle
// specification (spec.LifecycleYAML, the file the client is generated from).
type contract struct {
	router routers.Router
	apiKey string
}

// offSpec reports the statuses the real server (or a proxy before it)
// answers although the specification does not declare them for any
// operation: 422 for invalid requests (FastAPI), 429 and 502-504 from the
// infrastructure. Their bodies are checked against what the server really
// sends instead (see checkOffSpec).
func offSpec(status int) bool {
	switch status {
	case http.StatusUnprocessableEntity, http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// newContract loads the specification (that it is a valid document is
// checked once, by a test) and routes it under serverURL+"/v1",
// the base path of the real server. An empty apiKey, like a server started
// without one, accepts every request.
func newContract(serverURL, apiKey string) (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec.LifecycleYAML())
	if err != nil {
		return nil, fmt.Errorf("load the lifecycle specification: %w", err)
	}
	// The file names http://localhost:8080/v1; the fake serves elsewhere.
	doc.Servers = openapi3.Servers{{URL: serverURL + "/v1"}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route the lifecycle specification: %w", err)
	}
	return &contract{router: router, apiKey: apiKey}, nil
}

// validateRequest finds the operation of r and validates r against it: path,
// query, headers, the API key and the body. r's body stays readable. A nil
// route means no operation matches (err says why).
func (c *contract) validateRequest(ctx context.Context, r *http.Request) (*openapi3filter.RequestValidationInput, error) {
	route, params, err := c.router.FindRoute(r)
	if err != nil {
		return nil, err
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			MultiError:         true,
			AuthenticationFunc: c.authenticate,
		},
	}
	return in, openapi3filter.ValidateRequest(ctx, in)
}

// errUnauthorized marks a request without the right API key.
var errUnauthorized = errors.New("missing or wrong API key")

func (c *contract) authenticate(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if c.apiKey == "" {
		return nil
	}
	if in.SecurityScheme == nil || in.SecurityScheme.Type != "apiKey" || in.SecurityScheme.In != "header" {
		return fmt.Errorf("security scheme %q is not an API key header", in.SecuritySchemeName)
	}
	if in.RequestValidationInput.Request.Header.Get(in.SecurityScheme.Name) != c.apiKey {
		return errUnauthorized
	}
	return nil
}

// validateResponse checks a response the fake is about to send for the
// request validated as in. A status the operation does not declare is an
// error, except the off-spec statuses, whose bodies must have the shape the
// real server gives them.
func (c *contract) validateResponse(ctx context.Context, in *openapi3filter.RequestValidationInput, status int, header http.Header, body []byte) error {
	if offSpec(status) {
		return checkOffSpec(status, body)
	}
	return openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

// checkOffSpec checks the body of an undeclared status: a 422 is FastAPI's
// {"detail": [{"loc": [...], "msg": "...", "type": "..."}]}, anything else an
// ErrorResponse {"code", "message"}.
func checkOffSpec(status int, body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if status == http.StatusUnprocessableEntity {
		var v struct {
			Detail []struct {
				Type  string `json:"type"`
				Loc   []any  `json:"loc"`
				Msg   string `json:"msg"`
				Input any    `json:"input,omitempty"`
			} `json:"detail"`
		}
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("422 body is not FastAPI's validation error: %w", err)
		}
		if len(v.Detail) == 0 {
			return errors.New("422 body has no detail")
		}
		for _, d := range v.Detail {
			if d.Type == "" || len(d.Loc) == 0 || d.Msg == "" {
				return errors.New("422 detail lacks type, loc or msg")
			}
		}
		return nil
	}
	var v struct {
		Code    *string `json:"code"`
		Message *string `json:"message"`
	}
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%d body is not an ErrorResponse: %w", status, err)
	}
	if v.Code == nil || v.Message == nil {
		return fmt.Errorf("%d body lacks code or message", status)
	}
	return nil
}
