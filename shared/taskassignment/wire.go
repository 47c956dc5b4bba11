package taskassignment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// WireVersion is the version of the assignment message that Encode writes.
// A change of the message's shape takes a new version; Decode refuses any
// version it does not know rather than guessing.
const WireVersion = 1

// EventType is the CloudEvents type of an assignment carried as an event (the
// Knative path); the event's data is the Encode form, as application/json.
const EventType = "io.gitea-dynamic-runner.assignment.v1"

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
		Task:    wireTaskV1{ID: a.Task.ID, Pool: a.Task.Pool, Image: a.Task.Image},
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
	a := Assignment{
		ID:      w.ID,
		Backend: Backend(w.Backend),
		Task:    Task{ID: w.Task.ID, Pool: w.Task.Pool, Image: w.Task.Image},
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
