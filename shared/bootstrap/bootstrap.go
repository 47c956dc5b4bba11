// Package bootstrap derives what an executor is started with: its assignment,
// its SPIFFE ID, where the gateway is, and a capability that proves to the
// gateway which assignment it serves.
//
// Everything is a pure function of the assignment and the configured key: the
// same assignment always yields the same environment, so an executor created
// again after a crash needs no stored record, and the gateway checks a
// capability without any state. A capability is signed with the current key
// alone and verified with it or any old key (GDR_BOOTSTRAP_OLD_KEYS), so that
// the key rotates while executors run with capabilities of the old one.
package bootstrap

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// MinKeyLength is the shortest capability key accepted: the HMAC-SHA256 block
// of security it protects.
const MinKeyLength = 32

// The executor environment. The runner removes every one of them from its own
// environment before it runs a step.
const (
	EnvAssignmentID = "CI_ASSIGNMENT_ID"
	EnvTaskID       = "CI_TASK_ID"
	EnvSPIFFEID     = "CI_SPIFFE_ID"
	EnvCapability   = "CI_RUNNER_CAPABILITY"
	EnvGatewayURL   = "CI_GATEWAY_URL"
	// EnvGatewayID is the SPIFFE ID the runner requires of the gateway: an
	// executor talks to that one service and no other member of the trust
	// domain, so a compromised workload with another SVID cannot pose as it.
	EnvGatewayID = "CI_GATEWAY_SPIFFE_ID"
)

// DefaultGatewayPath is the path of the gateway's SPIFFE ID in the trust
// domain when none is configured: spiffe://<trust domain>/gateway.
const DefaultGatewayPath = "/gateway"

// Optional executor variables a backend adds to the environment itself.
const (
	// EnvSVIDCert, EnvSVIDKey and EnvSVIDBundle carry a minted X.509-SVID,
	// its key and the trust bundle (PEM) where no SPIRE agent can attest
	// the executor (local processes, sandboxes).
	EnvSVIDCert   = "CI_SVID_CERT"
	EnvSVIDKey    = "CI_SVID_KEY"
	EnvSVIDBundle = "CI_SVID_BUNDLE"
	// EnvJobImage is set by a backend that runs the executor in the image
	// of the job's `container:`: the job may then run on the host.
	EnvJobImage = "CI_JOB_IMAGE"
	// EnvJobServices is set by a backend that runs the job's `services:`
	// beside the runner, in its network namespace: their keys, comma
	// separated. EnvServiceTimeout is how long the runner waits for their
	// ports (a Go duration).
	EnvJobServices    = "CI_JOB_SERVICES"
	EnvServiceTimeout = "CI_JOB_SERVICES_TIMEOUT"
)

// Variables lists every variable Environment sets.
func Variables() []string {
	return []string{EnvAssignmentID, EnvTaskID, EnvSPIFFEID, EnvCapability, EnvGatewayURL, EnvGatewayID}
}

// capabilityDomain separates these MACs from any other use of the key.
const capabilityDomain = "gitea-dynamic-runner/capability/v1"

// Bootstrap issues executor credentials under its current key and checks
// them under it or any of its old keys.
type Bootstrap struct {
	key        []byte
	oldKeys    [][]byte
	gatewayURL string
	gatewayID  spiffeid.ID
}

// New returns a Bootstrap for executors that reach the gateway at gatewayURL
// (https: the gateway serves SPIFFE mTLS only), which they require to
// present gatewayID. It signs with key and verifies with key or any of old
// (a rotation). A key shorter than MinKeyLength is refused, an old one by its
// position (1 is the first).
func New(key secretkey.Key, gatewayURL string, gatewayID spiffeid.ID, old ...secretkey.Key) (*Bootstrap, error) {
	b, err := NewVerifier(key, old...)
	if err != nil {
		return nil, err
	}
	if err := checkGatewayURL(gatewayURL); err != nil {
		return nil, err
	}
	if gatewayID.IsZero() {
		return nil, errors.New("bootstrap: no gateway SPIFFE ID")
	}
	b.gatewayURL, b.gatewayID = gatewayURL, gatewayID
	return b, nil
}

func checkGatewayURL(gatewayURL string) error {
	u, err := url.Parse(gatewayURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return errors.New("bootstrap: the gateway URL is not an absolute https URL") // not quoted: a URL may carry user info
	}
	return nil
}

// NewVerifier returns a Bootstrap that only verifies capabilities (the
// gateway's part), under key or any of old; its Environment fails. Keys are
// refused as by New.
func NewVerifier(key secretkey.Key, old ...secretkey.Key) (*Bootstrap, error) {
	if err := errors.Join(key.AtLeast("bootstrap capability key", MinKeyLength),
		secretkey.Keys(old).AtLeast("old bootstrap capability keys", MinKeyLength)); err != nil {
		return nil, err
	}
	b := &Bootstrap{key: append([]byte(nil), key...)}
	for _, k := range old {
		b.oldKeys = append(b.oldKeys, append([]byte(nil), k...))
	}
	return b, nil
}

// Capability returns the capability of the assignment (ID, task ID, SPIFFE
// ID), under the current key.
func (b *Bootstrap) Capability(assignmentID string, taskID int64, spiffeID string) string {
	return capability(b.key, assignmentID, taskID, spiffeID)
}

func capability(key []byte, assignmentID string, taskID int64, spiffeID string) string {
	mac := hmac.New(sha256.New, key)
	for _, field := range []string{capabilityDomain, assignmentID, strconv.FormatInt(taskID, 10), spiffeID} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(field)))
		mac.Write(n[:])
		mac.Write([]byte(field))
	}
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// ErrBadCapability is returned by Verify for a capability that does not belong
// to the claimed assignment.
var ErrBadCapability = errors.New("capability does not match the assignment")

// Verify checks in constant time that capability was issued for the
// assignment (ID, task ID, SPIFFE ID) under the current key or an old one.
// Every key is tried whichever matches, so the time taken does not say which.
func (b *Bootstrap) Verify(assignmentID string, taskID int64, spiffeID, got string) error {
	match := subtle.ConstantTimeCompare([]byte(capability(b.key, assignmentID, taskID, spiffeID)), []byte(got))
	for _, k := range b.oldKeys {
		match |= subtle.ConstantTimeCompare([]byte(capability(k, assignmentID, taskID, spiffeID)), []byte(got))
	}
	if match != 1 {
		return ErrBadCapability
	}
	return nil
}

// Environment returns the executor environment of a. It implements
// executor.Bootstrap.
func (b *Bootstrap) Environment(a taskassignment.Assignment) (map[string]string, error) {
	if a.ID == "" || a.Task.ID <= 0 || a.Identity.SPIFFEID == "" {
		return nil, fmt.Errorf("bootstrap: assignment %q of task %d has no identity", a.ID, a.Task.ID)
	}
	if b.gatewayURL == "" {
		return nil, errors.New("bootstrap: a verifier issues no environment")
	}
	return map[string]string{
		EnvAssignmentID: a.ID,
		EnvTaskID:       strconv.FormatInt(a.Task.ID, 10),
		EnvSPIFFEID:     a.Identity.SPIFFEID,
		EnvCapability:   b.Capability(a.ID, a.Task.ID, a.Identity.SPIFFEID),
		EnvGatewayURL:   b.gatewayURL,
		EnvGatewayID:    b.gatewayID.String(),
	}, nil
}

// Values is what an executor reads back from its environment.
type Values struct {
	AssignmentID string
	TaskID       int64
	SPIFFEID     string
	Capability   string
	GatewayURL   string
	GatewayID    spiffeid.ID
}

// Read reads the executor environment through getenv (os.Getenv in the
// runner). A missing variable is an error naming it; a value never appears in
// an error.
func Read(getenv func(string) string) (Values, error) {
	for _, name := range Variables() {
		if getenv(name) == "" {
			return Values{}, fmt.Errorf("bootstrap: %s is not set", name)
		}
	}
	taskID, err := strconv.ParseInt(getenv(EnvTaskID), 10, 64)
	if err != nil || taskID <= 0 {
		return Values{}, fmt.Errorf("bootstrap: %s is not a task ID", EnvTaskID)
	}
	if err := checkGatewayURL(getenv(EnvGatewayURL)); err != nil {
		return Values{}, fmt.Errorf("bootstrap: %s: %w", EnvGatewayURL, err)
	}
	gatewayID, err := spiffeid.FromString(getenv(EnvGatewayID))
	if err != nil {
		return Values{}, fmt.Errorf("bootstrap: %s is not a SPIFFE ID", EnvGatewayID)
	}
	return Values{
		AssignmentID: getenv(EnvAssignmentID),
		TaskID:       taskID,
		SPIFFEID:     getenv(EnvSPIFFEID),
		Capability:   getenv(EnvCapability),
		GatewayURL:   getenv(EnvGatewayURL),
		GatewayID:    gatewayID,
	}, nil
}

// Settings is embedded in the configuration of every function that issues
// capabilities (handle, recover).
type Settings struct {
	KeySettings
	GatewayURL string `envconfig:"GDR_GATEWAY_URL" required:"true" desc:"https URL at which executors reach the gateway"`
	GatewayID  string `envconfig:"GDR_GATEWAY_SPIFFE_ID" desc:"SPIFFE ID executors require of the gateway; empty: spiffe://<trust domain>/gateway"`
}

// New returns the Bootstrap of s for executors of trust domain td. Its
// errors name the variable at fault.
func (s Settings) New(td spiffeid.TrustDomain) (*Bootstrap, error) {
	if err := s.KeySettings.Check(); err != nil {
		return nil, err
	}
	id, err := GatewayID(td, s.GatewayID)
	if err != nil {
		return nil, err
	}
	return New(s.Key, s.GatewayURL, id, s.OldKeys...)
}

// Check reports what New(td) would fail on; with a trust domain that did
// not parse (zero), only what does not depend on it.
func (s Settings) Check(td spiffeid.TrustDomain) error {
	keys := s.KeySettings.Check()
	if td.IsZero() || keys != nil {
		return errors.Join(keys, checkGatewayURL(s.GatewayURL))
	}
	_, err := s.New(td)
	return err
}

// GatewayID is the gateway's SPIFFE ID: configured, which must be of trust
// domain td, or spiffe://<td>/gateway when empty.
func GatewayID(td spiffeid.TrustDomain, configured string) (spiffeid.ID, error) {
	if configured == "" {
		id, err := spiffeid.FromPath(td, DefaultGatewayPath)
		if err != nil {
			return spiffeid.ID{}, fmt.Errorf("GDR_GATEWAY_SPIFFE_ID: %w", err)
		}
		return id, nil
	}
	id, err := spiffeid.FromString(configured)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("GDR_GATEWAY_SPIFFE_ID %q: %w", configured, err)
	}
	if !id.MemberOf(td) {
		return spiffeid.ID{}, fmt.Errorf("GDR_GATEWAY_SPIFFE_ID %q is outside trust domain %q", configured, td.Name())
	}
	return id, nil
}

// KeySettings are the capability keys, embedded in Settings and in the
// configuration of the gateway, which verifies capabilities only.
type KeySettings struct {
	Key     secretkey.Key  `envconfig:"GDR_BOOTSTRAP_KEY" required:"true" desc:"base64 key (at least 32 bytes) that signs executor capabilities; handle, recover and gateway need the same one"`
	OldKeys secretkey.Keys `envconfig:"GDR_BOOTSTRAP_OLD_KEYS" desc:"comma-separated base64 keys (at least 32 bytes each) an executor's capability is also verified with when GDR_BOOTSTRAP_KEY does not verify it (the gateway verifies): a rotation's other key (docs/OPERATIONS.md, \"Rotating secrets\"); capabilities are signed with GDR_BOOTSTRAP_KEY alone; set wherever GDR_BOOTSTRAP_KEY is"`
}

// Check reports a key, current or old, shorter than MinKeyLength, naming the
// variable (and an old key's position), never a key.
func (s KeySettings) Check() error {
	return errors.Join(s.Key.AtLeast("GDR_BOOTSTRAP_KEY", MinKeyLength), s.OldKeys.AtLeast("GDR_BOOTSTRAP_OLD_KEYS", MinKeyLength))
}

// Verifier returns the verifier of s (the gateway's); its errors name the
// variable at fault.
func (s KeySettings) Verifier() (*Bootstrap, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return NewVerifier(s.Key, s.OldKeys...)
}
