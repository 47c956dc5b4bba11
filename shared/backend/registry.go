package backend

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Registration is what a backend's package gives the binaries that link it,
// from its function Registration (no package variable, no init): its kind
// (GDR_BACKEND, a pool's backend), the check of its settings and its
// builder. A Registration without Build is a backend the build does not
// link (package linked's answer for a backend its build tags leave out).
type Registration struct {
	Kind taskassignment.BackendKind
	// Check reports the settings Kind needs and lacks, or holds in a
	// combination it refuses, as Build would, but without connecting to
	// anything: a function checks them with the rest of its configuration,
	// so that a missing setting is a configuration error (exit 2), not a
	// failure to start. Build starts with it too.
	Check func(BuildSettings) error
	Build Builder
}

// Registry is the backends a binary links (package linked's Backends).
type Registry []Registration

// lookup returns kind's registration; ok is false when the build does not
// link kind.
func (r Registry) lookup(kind taskassignment.BackendKind) (reg Registration, ok bool) {
	for _, reg := range r {
		if reg.Kind == kind && reg.Build != nil {
			return reg, true
		}
	}
	return Registration{}, false
}

// Linked reports nil when kind is linked, else an error naming GDR_BACKEND
// and the kinds that are.
func (r Registry) Linked(kind taskassignment.BackendKind) error {
	if _, err := taskassignment.ParseBackendKind(string(kind)); err != nil {
		return fmt.Errorf("GDR_BACKEND %q: unknown backend", kind)
	}
	if _, ok := r.lookup(kind); !ok {
		return fmt.Errorf("GDR_BACKEND %q: this binary was built without that backend; it has %s", kind, r.kinds())
	}
	return nil
}

// Kinds are the linked kinds, sorted.
func (r Registry) Kinds() []taskassignment.BackendKind {
	var ks []taskassignment.BackendKind
	for _, reg := range r {
		if reg.Build != nil {
			ks = append(ks, reg.Kind)
		}
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// kinds lists the linked kinds, sorted, for messages ("none" for none).
func (r Registry) kinds() string {
	ks := r.Kinds()
	if len(ks) == 0 {
		return "none"
	}
	var s []string
	for _, k := range ks {
		s = append(s, string(k))
	}
	return strings.Join(s, ", ")
}

// Check is Linked, then kind's Registration.Check of c.
func (r Registry) Check(kind taskassignment.BackendKind, c BuildSettings) error {
	if err := r.Linked(kind); err != nil {
		return err
	}
	if reg, _ := r.lookup(kind); reg.Check != nil {
		return reg.Check(c)
	}
	return nil
}

// New builds backend kind with its builder. The returned function releases
// what the backend holds open; call it once the backend is no longer used.
func (r Registry) New(kind taskassignment.BackendKind, c BuildSettings, d Deps) (executor.Backend, func() error, error) {
	if err := r.Linked(kind); err != nil {
		return nil, nil, err
	}
	reg, _ := r.lookup(kind)
	return reg.Build(c, d)
}
