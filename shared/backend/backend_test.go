package backend_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestRegistryBuildsOnlyWhatIsLinked: New runs the builder of the kind asked
// for and no other; a kind without a builder is refused naming GDR_BACKEND
// and what is linked, an unknown kind as unknown. Check is Linked, then the
// kind's own Check.
func TestRegistryBuildsOnlyWhatIsLinked(t *testing.T) {
	var built []taskassignment.BackendKind
	registration := func(kind taskassignment.BackendKind) backend.Registration {
		return backend.Registration{
			Kind:  kind,
			Check: func(backend.BuildSettings) error { return errors.New("checked " + string(kind)) },
			Build: func(backend.BuildSettings, backend.Deps) (executor.Backend, func() error, error) {
				built = append(built, kind)
				return nil, func() error { return nil }, errors.New("built " + string(kind))
			},
		}
	}
	r := backend.Registry{
		registration(taskassignment.BackendProcess),
		registration(taskassignment.BackendOpenSandbox),
		{}, // not linked: package linked's answer for a backend the tags leave out
	}
	if got, want := r.Kinds(), []taskassignment.BackendKind{taskassignment.BackendOpenSandbox, taskassignment.BackendProcess}; !slices.Equal(got, want) {
		t.Errorf("Kinds = %v, want %v", got, want)
	}
	if _, _, err := r.New(taskassignment.BackendOpenSandbox, backend.BuildSettings{}, backend.Deps{}); err == nil || err.Error() != "built opensandbox" {
		t.Fatalf("New(opensandbox) = %v, want its builder's answer", err)
	}
	if len(built) != 1 || built[0] != taskassignment.BackendOpenSandbox {
		t.Fatalf("built %v, want only opensandbox", built)
	}
	if err := r.Check(taskassignment.BackendProcess, backend.BuildSettings{}); err == nil || err.Error() != "checked process" {
		t.Errorf("Check(process) = %v, want its own Check's answer", err)
	}
	for _, tt := range []struct {
		kind taskassignment.BackendKind
		want string
	}{
		{taskassignment.BackendPod, `GDR_BACKEND "pod": this binary was built without that backend; it has opensandbox, process`},
		{"vm", `GDR_BACKEND "vm": unknown backend`},
	} {
		if err := r.Linked(tt.kind); err == nil || err.Error() != tt.want {
			t.Errorf("Linked(%s) = %v, want %q", tt.kind, err, tt.want)
		}
		if err := r.Check(tt.kind, backend.BuildSettings{}); err == nil || err.Error() != tt.want {
			t.Errorf("Check(%s) = %v, want %q", tt.kind, err, tt.want)
		}
		if _, _, err := r.New(tt.kind, backend.BuildSettings{}, backend.Deps{}); err == nil || err.Error() != tt.want {
			t.Errorf("New(%s) = %v, want %q", tt.kind, err, tt.want)
		}
	}
	if len(built) != 1 {
		t.Fatalf("built %v after refusals", built)
	}
	if err := (backend.Registry{}).Linked(taskassignment.BackendPod); err == nil || !strings.HasSuffix(err.Error(), "it has none") {
		t.Errorf("empty Registry: %v", err)
	}
}

// TestSetupCheckNamesTheVariable: each backend's missing or conflicting
// setting is reported naming its GDR_ variable.
func TestSetupCheckNamesTheVariable(t *testing.T) {
	type (
		pod = backend.PodSettings
		osb = backend.OpenSandboxSettings
	)
	for _, tt := range []struct {
		kind  string
		check func(backend.BuildSettings) error
		setup backend.BuildSettings
		want  string
	}{
		{"process", backend.CheckProcess, backend.BuildSettings{}, "GDR_CA_DIR"},
		{"opensandbox", backend.CheckOpenSandbox, backend.BuildSettings{}, "GDR_OPENSANDBOX_URL"},
		{"opensandbox", backend.CheckOpenSandbox, backend.BuildSettings{OpenSandboxSettings: osb{OpenSandboxURL: "http://x", OpenSandboxSPIRE: "unix:/s"}, CADir: "/ca"}, "set one, not both"},
		{"pod", backend.CheckPod, backend.BuildSettings{}, "GDR_CLUSTER_NAME"},
		{"pod", backend.CheckPod, backend.BuildSettings{PodSettings: pod{ClusterName: "c", SPIREServer: "s:8081", PodIdentity: "agent"}}, `GDR_POD_IDENTITY "agent": want minted, ca or workload-api`},
		{"pod", backend.CheckPod, backend.BuildSettings{PodSettings: pod{PodIdentity: backend.PodIdentityCA}}, "GDR_CA_DIR is required for the pod backend with GDR_POD_IDENTITY=ca"},
	} {
		if err := tt.check(tt.setup); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %+v: Check = %v, want %q", tt.kind, tt.setup, err, tt.want)
		}
	}
	for _, id := range []string{backend.PodIdentityMinted, backend.PodIdentityWorkloadAPI} {
		if err := backend.CheckPod(backend.BuildSettings{PodSettings: pod{ClusterName: "c", SPIREServer: "s:8081", PodIdentity: id}}); err != nil {
			t.Errorf("pod with GDR_POD_IDENTITY=%s: %v", id, err)
		}
	}
	// The installation's CA: no SPIRE Server, no cluster name.
	if err := backend.CheckPod(backend.BuildSettings{PodSettings: pod{PodIdentity: backend.PodIdentityCA}, CADir: "/ca"}); err != nil {
		t.Errorf("pod with GDR_POD_IDENTITY=ca: %v", err)
	}
	if err := backend.CheckProcess(backend.BuildSettings{CADir: "/ca"}); err != nil {
		t.Errorf("process with a CA: %v", err)
	}
}
