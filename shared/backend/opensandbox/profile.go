package opensandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
)

// Profile is the OpenSandbox part of a runner pool: the JSON object in
// runnerpool.Pool.Profile of a pool whose backend is opensandbox. Either
// PoolRef names a pre-warmed OpenSandbox pool (which then defines image,
// entrypoint and resources), or Image, Entrypoint and ResourceLimits are all
// set.
//
//	{"poolRef": "ci-runners"}
//	{"image": "registry.example.org/runner:1", "entrypoint": ["/runner"],
//	 "resourceLimits": {"cpu": "2", "memory": "4Gi"}, "env": {"TZ": "UTC"}}
type Profile struct {
	PoolRef        string            `json:"poolRef,omitempty"`
	Image          string            `json:"image,omitempty"`
	Entrypoint     []string          `json:"entrypoint,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	// Env is added to every sandbox's environment. It must not name a
	// variable of the executor environment (the bootstrap variables, the
	// SVID variables): those always come from the assignment.
	Env map[string]string `json:"env,omitempty"`
}

// ParseProfile reads a pool's profile. Unknown fields, a poolRef together
// with image, entrypoint or resourceLimits, and a profile without poolRef
// that lacks any of them are errors naming the field. Env values never
// appear in an error.
func ParseProfile(raw json.RawMessage) (Profile, error) {
	var p Profile
	if len(bytes.TrimSpace(raw)) == 0 {
		return p, errors.New("no profile: want poolRef, or image, entrypoint and resourceLimits")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Profile{}, fmt.Errorf("profile: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Profile{}, errors.New("profile: more than one JSON value")
	}
	if p.PoolRef != "" {
		if p.Image != "" || len(p.Entrypoint) > 0 || len(p.ResourceLimits) > 0 {
			return Profile{}, errors.New("profile: poolRef excludes image, entrypoint and resourceLimits (the pool defines them)")
		}
	} else {
		switch {
		case p.Image == "":
			return Profile{}, errors.New("profile: image is required without poolRef")
		case len(p.Entrypoint) == 0:
			return Profile{}, errors.New("profile: entrypoint is required without poolRef")
		case len(p.ResourceLimits) == 0:
			return Profile{}, errors.New("profile: resourceLimits is required without poolRef")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		if k == "" {
			return Profile{}, errors.New("profile: env has an empty variable name")
		}
		if slices.Contains(executorVariables(), k) {
			return Profile{}, fmt.Errorf("profile: env %q is a variable of the executor environment", k)
		}
	}
	return p, nil
}
