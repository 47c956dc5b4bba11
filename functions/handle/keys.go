//go:build gdr_pod || !(gdr_opensandbox || gdr_pod || gdr_process)

package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installsecrets"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// keysProgram is `handle keys`: the chart's keys Job.
var keysProgram = function.Program{Name: "handle", Synopsis: "keys", Commands: []string{"keys"}}

// KeysConfig is what `handle keys` reads.
type KeysConfig struct {
	function.CommonSettings

	Namespace   string `envconfig:"GDR_KEYS_NAMESPACE" required:"true" desc:"keys: the release's namespace, where its keys are kept"`
	Owner       string `envconfig:"GDR_KEYS_OWNER" desc:"keys: a ConfigMap of the release that owns every object made, so that they go with it; empty: none"`
	CA          bool   `envconfig:"GDR_KEYS_CA" default:"false" desc:"keys: also the installation's CA (gdr-identity-ca), its bundle (gdr-identity-bundle) and the gateway's certificate (gdr-gateway-svid), for GDR_POD_IDENTITY=ca"`
	TrustDomain string `envconfig:"GDR_TRUST_DOMAIN" desc:"keys, with GDR_KEYS_CA: the trust domain of the CA"`
	GatewayID   string `envconfig:"GDR_GATEWAY_SPIFFE_ID" desc:"keys, with GDR_KEYS_CA: the gateway's SPIFFE ID, its certificate's"`
	// The pools' registrations (gdr-runner-credentials), with GDR_KEYS_REGISTER.
	Register          bool   `envconfig:"GDR_KEYS_REGISTER" default:"false" desc:"keys: also register with Gitea every pool of GDR_POOLS_FILE that gdr-runner-credentials lacks, with GDR_REGISTRATION_TOKEN, and add its credentials"`
	PoolsFile         string `envconfig:"GDR_POOLS_FILE" desc:"keys, with GDR_KEYS_REGISTER: the pools file"`
	StateDir          string `envconfig:"GDR_STATE_DIR" default:"/var/lib/gitea-dynamic-runner" desc:"keys, with GDR_KEYS_REGISTER: where the functions find the credentials (the Secret's mount), for their file names"`
	GiteaURL          string `envconfig:"GDR_GITEA_URL" desc:"keys, with GDR_KEYS_REGISTER: Gitea's root URL"`
	RegistrationToken string `envconfig:"GDR_REGISTRATION_TOKEN" desc:"keys, with GDR_KEYS_REGISTER: Gitea's runner registration token (needed while a pool is unregistered)"`
	RunnerName        string `envconfig:"GDR_RUNNER_NAME" default:"gitea-dynamic-runner" desc:"keys, with GDR_KEYS_REGISTER: runner name prefix; a pool registers as <name>-<pool>"`

	td      spiffeid.TrustDomain
	gateway spiffeid.ID
	pools   runnerpool.Pools
}

// Check parses the identities GDR_KEYS_CA needs and loads the pools GDR_KEYS_REGISTER does.
func (c *KeysConfig) Check() error {
	if c.Register {
		if c.PoolsFile == "" || c.GiteaURL == "" {
			return errors.New("GDR_KEYS_REGISTER: GDR_POOLS_FILE and GDR_GITEA_URL are required")
		}
		pools, err := runnerpool.PoolSettings{PoolsFile: c.PoolsFile, StateDir: c.StateDir}.Load()
		if err != nil {
			return err
		}
		c.pools = pools
	}
	if !c.CA {
		return nil
	}
	td, err := spiffeid.TrustDomainFromString(c.TrustDomain)
	if err != nil {
		return fmt.Errorf("GDR_TRUST_DOMAIN %q: %w", c.TrustDomain, err)
	}
	gw, err := spiffeid.FromString(c.GatewayID)
	if err != nil || !gw.MemberOf(td) {
		return fmt.Errorf("GDR_GATEWAY_SPIFFE_ID %q: want a SPIFFE ID of trust domain %s", c.GatewayID, td.Name())
	}
	c.td, c.gateway = td, gw
	return nil
}

// keys runs `handle keys`: installsecrets.Ensure in the release's namespace, as the
// ServiceAccount of the chart's keys Job (KUBECONFIG, else in-cluster), one line per object.
func keys(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cfg KeysConfig
	return keysProgram.Exec(ctx, &cfg, args, stderr, func(ctx context.Context, log *slog.Logger, args []string) error {
		if len(args) > 1 {
			return function.Usage(fmt.Errorf("keys takes no arguments, got %q", args[1:]))
		}
		client, err := pod.KubernetesClient()
		if err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		opt := installsecrets.Options{Namespace: cfg.Namespace, CA: cfg.CA, TrustDomain: cfg.td, GatewayID: cfg.gateway, Random: rand.Reader}
		if cfg.Register {
			opt.Runners = &installsecrets.Runners{GiteaURL: cfg.GiteaURL, Token: cfg.RegistrationToken, Name: cfg.RunnerName,
				Pools: cfg.pools, HTTP: &http.Client{Timeout: 30 * time.Second}}
		}
		if cfg.Owner != "" {
			cm, err := client.CoreV1().ConfigMaps(cfg.Namespace).Get(ctx, cfg.Owner, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("keys: GDR_KEYS_OWNER: ConfigMap %s: %w", cfg.Owner, err)
			}
			opt.Owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}
		}
		report, err := installsecrets.Ensure(ctx, client, opt)
		for _, line := range report {
			fmt.Fprintln(stdout, line)
		}
		if err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		log.Info("keys ensured", slog.Int("objects", len(report)))
		return nil
	})
}
