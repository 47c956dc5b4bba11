package process

import (
	"context"
	"errors"
	"time"

	"os"
	"path/filepath"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

type failingMinter struct{}

func (failingMinter) MintX509SVID(context.Context, spiffeid.ID, time.Duration) (*x509svid.SVID, *x509bundle.Bundle, error) {
	return nil, nil, errors.New("CA unavailable")
}

// TestCreateErrorClasses: a runner that can never start makes a permanent
// error; a failure of the moment does not.
func TestCreateErrorClasses(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(t *testing.T, b *Backend, a *taskassignment.Assignment)
		permanent bool
	}{
		{"runner missing", func(t *testing.T, b *Backend, _ *taskassignment.Assignment) {
			b.cfg.Runner = filepath.Join(t.TempDir(), "no-such-runner")
		}, true},
		{"runner not in PATH", func(_ *testing.T, b *Backend, _ *taskassignment.Assignment) {
			b.cfg.Runner = "gdr-no-such-runner-in-path"
		}, true},
		{"runner not executable", func(t *testing.T, b *Backend, _ *taskassignment.Assignment) {
			if err := os.Chmod(b.cfg.Runner, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"runner is a directory", func(t *testing.T, b *Backend, _ *taskassignment.Assignment) {
			b.cfg.Runner = t.TempDir()
		}, true},
		{"assignment of another backend", func(_ *testing.T, _ *Backend, a *taskassignment.Assignment) {
			a.Backend = taskassignment.BackendPod
		}, true},
		{"SVID not minted (transient)", func(_ *testing.T, b *Backend, _ *taskassignment.Assignment) {
			b.cfg.Minter = failingMinter{}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, a, spec := setup(t, "exit 0")
			tt.edit(t, b, &a)
			_, err := b.Create(context.Background(), a, spec)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if got := executor.IsPermanent(err); got != tt.permanent {
				t.Fatalf("IsPermanent(%v) = %v, want %v", err, got, tt.permanent)
			}
		})
	}
}
