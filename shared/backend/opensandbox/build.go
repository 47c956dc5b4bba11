package opensandbox

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox/sandboxapi"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/spiremint"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Registration is the opensandbox backend's (GDR_BACKEND=opensandbox), as package
// backend/linked links it.
func Registration() backend.Registration {
	return backend.Registration{Kind: taskassignment.BackendOpenSandbox, Check: backend.CheckOpenSandbox, Build: Build}
}

// Build is the opensandbox backend's backend.Builder. The SPIRE Server, when
// set, is dialled lazily (connected on the first mint, so recover, which
// never mints, never connects); the returned function closes that
// connection.
func Build(c backend.BuildSettings, d backend.Deps) (executor.Backend, func() error, error) {
	if err := backend.CheckOpenSandbox(c); err != nil {
		return nil, nil, err
	}
	client, err := sandboxapi.New(sandboxapi.Options{BaseURL: c.OpenSandboxURL, APIKey: c.OpenSandboxKey})
	if err != nil {
		return nil, nil, err
	}
	cfg := Config{Sandboxes: client, Keys: d.Keys, TrustDomain: d.TrustDomain, Pools: d.Pools, OnCorrupt: d.Corrupt(),
		MaxTimeout: c.OpenSandboxMaxTimeout, Log: d.Log, OnEvent: logEvent(d.Log)}
	release := func() error { return nil }
	switch {
	case c.OpenSandboxSPIRE != "":
		spire, err := spiremint.Dial(c.OpenSandboxSPIRE, d.TrustDomain)
		if err != nil {
			return nil, nil, fmt.Errorf("GDR_OPENSANDBOX_SPIRE_SERVER: %w", err)
		}
		cfg.Minter, release = spire, spire.Close
	case c.CADir != "":
		ca, err := svidca.LoadOrCreate(c.CADir, d.TrustDomain)
		if err != nil {
			return nil, nil, fmt.Errorf("GDR_CA_DIR: %w", err)
		}
		cfg.Minter = ca
	}
	b, err := New(cfg)
	if err != nil {
		_ = release()
		return nil, nil, err
	}
	return b, release, nil
}

// logEvent logs what the backend did on its own on log (nil: nothing):
// warnings for what a failure caused, info for the rest. An Event carries
// IDs and an API error, never an environment value.
func logEvent(log *slog.Logger) func(Event) {
	if log == nil {
		return nil
	}
	return func(e Event) {
		level := slog.LevelInfo
		if e.Err != nil {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{slog.String("sandbox", e.SandboxID), slog.String("assignment", e.AssignmentID)}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("error", e.Err))
		}
		log.LogAttrs(context.Background(), level, string(e.Name), attrs...)
	}
}
