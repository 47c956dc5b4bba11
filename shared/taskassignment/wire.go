package taskassignment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// WireVersion is the version of the assignment message that Encode writes.
// A change of the message's shape takes a new version; Decode refuses any
// version it does not know rather than guessing.
const WireVersion = 1

// EventType is the CloudEvents type of an assignment carried as an event (the
// Knative path); the event's data is the Encode form, as application/json.
const EventType = "io.gitea-dynamic-runner.assignment.v1"

// RejectionType is the CloudEvents type of handle's reply to an assignment
// event it can never accept (the Knative path): the data is the signed
// assignment as it came, the extension ReasonExtension says why, and the
// Subscription's reply takes it to recover, which fails the task.
const RejectionType = "io.gitea-dynamic-runner.rejection.v1"

// ReasonExtension is the CloudEvents extension of a rejection's reason.
const ReasonExtension = "gdrreason"

// MaxReason bounds a reason carried in an event, in bytes.
const MaxReason = 1024

// ReasonLine makes s one printable line of at most MaxReason bytes of valid
// UTF-8: a reason travels as an HTTP header (a CloudEvent extension in
// binary mode) and ends in a job's log.
func ReasonLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	s = strings.TrimSpace(s)
	if len(s) > MaxReason {
		s = strings.ToValidUTF8(s[:MaxReason], "")
	}
	return s
}

// ErrMalformed marks a message that can never decode, whatever is retried:
// its consumer should terminate it rather than redeliver it.
var ErrMalformed = errors.New("malformed assignment message")

type wireEnvelope struct {
	Version *int `json:"version"`
}

type wireV1 struct {
	Version  int            `json:"version"`
	ID       string         `json:"id"`
	Backend  string         `json:"backend"`
	Task     wireTaskV1     `json:"task"`
	Identity wireIdentityV1 `json:"identity"`
}

type wireTaskV1 struct {
	ID    int64  `json:"id"`
	Pool  string `json:"pool"`
	Image string `json:"image,omitempty"`
	// Services is absent for a job without services, so such a message is
	// byte for byte what a build without services wrote.
	Services []wireServiceV1 `json:"services,omitempty"`
}

type wireServiceV1 struct {
	ID          string            `json:"id"`
	Image       string            `json:"image"`
	Env         map[string]string `json:"env,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	Cmd         []string          `json:"cmd,omitempty"`
	Options     string            `json:"options,omitempty"`
	Credentials bool              `json:"credentials,omitempty"`
}

func wireServices(services []jobservices.Service) []wireServiceV1 {
	var out []wireServiceV1
	for _, s := range services {
		out = append(out, wireServiceV1{ID: s.ID, Image: s.Image, Env: s.Env, Ports: s.Ports, Volumes: s.Volumes,
			Cmd: s.Cmd, Options: s.Options, Credentials: s.Credentials})
	}
	return out
}

func fromWireServices(ws []wireServiceV1) ([]jobservices.Service, error) {
	var out []jobservices.Service
	for i, w := range ws {
		switch {
		case w.ID == "":
			return nil, fmt.Errorf("missing field \"task.services[%d].id\"", i)
		case w.Image == "":
			return nil, fmt.Errorf("missing field \"task.services[%d].image\"", i)
		case i > 0 && ws[i-1].ID >= w.ID:
			return nil, fmt.Errorf("task.services: %q after %q: want distinct IDs in order", w.ID, ws[i-1].ID)
		}
		s := jobservices.Service{ID: w.ID, Image: w.Image, Env: w.Env, Ports: w.Ports, Volumes: w.Volumes,
			Cmd: w.Cmd, Options: w.Options, Credentials: w.Credentials}
		// Empty is absent, as Encode writes it: a decoded assignment
		// encodes to the same bytes.
		if len(s.Env) == 0 {
			s.Env = nil
		}
		for _, l := range []*[]string{&s.Ports, &s.Volumes, &s.Cmd} {
			if len(*l) == 0 {
				*l = nil
			}
		}
		out = append(out, s)
	}
	return out, nil
}

type wireIdentityV1 struct {
	Repository string `json:"repository"`
	Job        string `json:"job"`
	SPIFFEID   string `json:"spiffe_id"`
}

// Encode returns the wire form of a: JSON of version WireVersion.
func Encode(a Assignment) ([]byte, error) {
	return json.Marshal(wireV1{
		Version: WireVersion,
		ID:      a.ID,
		Backend: string(a.Backend),
		Task:    wireTaskV1{ID: a.Task.ID, Pool: a.Task.Pool, Image: a.Task.Image, Services: wireServices(a.Task.Services)},
		Identity: wireIdentityV1{
			Repository: a.Identity.Repository,
			Job:        a.Identity.Task,
			SPIFFEID:   a.Identity.SPIFFEID,
		},
	})
}

// Decode parses a message written by Encode and validates it in trust domain
// td (see Assignment.Validate). Every error wraps ErrMalformed and names what
// is wrong: not one JSON object, an unknown version, a missing or unknown
// field, or an assignment that breaks an invariant.
func Decode(data []byte, td spiffeid.TrustDomain) (Assignment, error) {
	a, err := decode(data, td)
	if err != nil {
		return Assignment{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return a, nil
}

func decode(data []byte, td spiffeid.TrustDomain) (Assignment, error) {
	var env wireEnvelope
	if err := json.Unmarshal(data, &env); err != nil {
		return Assignment{}, fmt.Errorf("not a JSON object: %w", err)
	}
	if env.Version == nil {
		return Assignment{}, errors.New(`missing field "version"`)
	}
	if *env.Version != WireVersion {
		return Assignment{}, fmt.Errorf("unsupported version %d (this build reads version %d)", *env.Version, WireVersion)
	}
	var w wireV1
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Assignment{}, fmt.Errorf("version %d: %w", WireVersion, err)
	}
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"id", w.ID == ""},
		{"backend", w.Backend == ""},
		{"task.id", w.Task.ID == 0},
		{"task.pool", w.Task.Pool == ""},
		{"identity.repository", w.Identity.Repository == ""},
		{"identity.job", w.Identity.Job == ""},
		{"identity.spiffe_id", w.Identity.SPIFFEID == ""},
	} {
		if f.missing {
			return Assignment{}, fmt.Errorf("missing field %q", f.name)
		}
	}
	services, err := fromWireServices(w.Task.Services)
	if err != nil {
		return Assignment{}, err
	}
	a := Assignment{
		ID:      w.ID,
		Backend: BackendKind(w.Backend),
		Task:    Task{ID: w.Task.ID, Pool: w.Task.Pool, Image: w.Task.Image, Services: services},
		Identity: taskidentity.Identity{
			Repository: w.Identity.Repository,
			Task:       w.Identity.Job,
			SPIFFEID:   w.Identity.SPIFFEID,
		},
	}
	if err := a.Validate(td); err != nil {
		return Assignment{}, err
	}
	return a, nil
}
