package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestBuildersBuildOnlyWhatIsLinked: New runs the builder of the kind asked
// for and no other; a kind without a builder is refused naming GDR_BACKEND
// and what is linked, an unknown kind as unknown.
func TestBuildersBuildOnlyWhatIsLinked(t *testing.T) {
	var built []taskassignment.BackendKind
	builder := func(kind taskassignment.BackendKind) backend.Builder {
		return func(backend.BuildSettings, backend.Deps) (backend.Backend, func() error, error) {
			built = append(built, kind)
			return nil, func() error { return nil }, errors.New("built " + string(kind))
		}
	}
	bs := backend.Builders{
		taskassignment.BackendProcess:     builder(taskassignment.BackendProcess),
		taskassignment.BackendOpenSandbox: builder(taskassignment.BackendOpenSandbox),
		taskassignment.BackendPod:         nil, // not linked
	}
	if _, _, err := bs.New(taskassignment.BackendOpenSandbox, backend.BuildSettings{}, backend.Deps{}); err == nil || err.Error() != "built opensandbox" {
		t.Fatalf("New(opensandbox) = %v, want its builder's answer", err)
	}
	if len(built) != 1 || built[0] != taskassignment.BackendOpenSandbox {
		t.Fatalf("built %v, want only opensandbox", built)
	}
	for _, tt := range []struct {
		kind taskassignment.BackendKind
		want string
	}{
		{taskassignment.BackendPod, `GDR_BACKEND "pod": this binary was built without that backend; it has opensandbox, process`},
		{"vm", `GDR_BACKEND "vm": unknown backend`},
	} {
		if err := bs.Linked(tt.kind); err == nil || err.Error() != tt.want {
			t.Errorf("Linked(%s) = %v, want %q", tt.kind, err, tt.want)
		}
		if _, _, err := bs.New(tt.kind, backend.BuildSettings{}, backend.Deps{}); err == nil || err.Error() != tt.want {
			t.Errorf("New(%s) = %v, want %q", tt.kind, err, tt.want)
		}
	}
	if len(built) != 1 {
		t.Fatalf("built %v after refusals", built)
	}
	if err := (backend.Builders{}).Linked(taskassignment.BackendPod); err == nil || !strings.HasSuffix(err.Error(), "it has none") {
		t.Errorf("empty Builders: %v", err)
	}
}

// TestSetupCheckNamesTheVariable: each backend's missing or conflicting
// setting is reported naming its GDR_ variable.
func TestSetupCheckNamesTheVariable(t *testing.T) {
	for _, tt := range []struct {
		kind  taskassignment.BackendKind
		setup backend.BuildSettings
		want  string
	}{
		{taskassignment.BackendProcess, backend.BuildSettings{}, "GDR_CA_DIR"},
		{taskassignment.BackendOpenSandbox, backend.BuildSettings{}, "GDR_OPENSANDBOX_URL"},
		{taskassignment.BackendOpenSandbox, backend.BuildSettings{OpenSandboxURL: "http://x", OpenSandboxSPIRE: "unix:/s", CADir: "/ca"}, "set one, not both"},
		{taskassignment.BackendPod, backend.BuildSettings{}, "GDR_CLUSTER_NAME"},
		{taskassignment.BackendPod, backend.BuildSettings{ClusterName: "c", SPIREServer: "s:8081", PodIdentity: "agent"}, `GDR_POD_IDENTITY "agent": want minted, ca or workload-api`},
		{taskassignment.BackendPod, backend.BuildSettings{PodIdentity: backend.PodIdentityCA}, "GDR_CA_DIR is required for the pod backend with GDR_POD_IDENTITY=ca"},
	} {
		if err := tt.setup.Check(tt.kind); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %+v: Check = %v, want %q", tt.kind, tt.setup, err, tt.want)
		}
	}
	for _, id := range []string{backend.PodIdentityMinted, backend.PodIdentityWorkloadAPI} {
		if err := (backend.BuildSettings{ClusterName: "c", SPIREServer: "s:8081", PodIdentity: id}).Check(taskassignment.BackendPod); err != nil {
			t.Errorf("pod with GDR_POD_IDENTITY=%s: %v", id, err)
		}
	}
	// The installation's CA: no SPIRE Server, no cluster name.
	if err := (backend.BuildSettings{PodIdentity: backend.PodIdentityCA, CADir: "/ca"}).Check(taskassignment.BackendPod); err != nil {
		t.Errorf("pod with GDR_POD_IDENTITY=ca: %v", err)
	}
	if err := (backend.BuildSettings{CADir: "/ca"}).Check(taskassignment.BackendProcess); err != nil {
		t.Errorf("process with a CA: %v", err)
	}
}
