package pod

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EntryClient is the part of the SPIRE Server Entry API (spire-api-sdk
// entry/v1) the backend uses. entryv1.NewEntryClient(conn) satisfies it.
// The caller needs admin rights on the API (a local unix-socket caller, or an
// admin X509-SVID) for the entry IDs under the configured prefix.
type EntryClient interface {
	BatchCreateEntry(ctx context.Context, in *entryv1.BatchCreateEntryRequest, opts ...grpc.CallOption) (*entryv1.BatchCreateEntryResponse, error)
	GetEntry(ctx context.Context, in *entryv1.GetEntryRequest, opts ...grpc.CallOption) (*types.Entry, error)
	BatchDeleteEntry(ctx context.Context, in *entryv1.BatchDeleteEntryRequest, opts ...grpc.CallOption) (*entryv1.BatchDeleteEntryResponse, error)
}

// ErrEntryConflict is returned by BindIdentity when the entry ID of the
// assignment is taken by an entry for another SPIFFE ID, or when SPIRE holds
// an entry with the same SPIFFE ID, parent and selectors under an ID the
// backend does not own. Neither is repaired automatically.
var ErrEntryConflict = errors.New("conflicting SPIRE registration entry")

// entryIDHashLength is the number of hex digits of the assignment ID's
// SHA-256 in an entry ID (128 bits).
const entryIDHashLength = 32

// MaxEntryIDPrefixLength keeps prefix + hash within SPIRE's 255-character
// limit on entry IDs.
const MaxEntryIDPrefixLength = 255 - entryIDHashLength

// EntryID returns the SPIRE registration entry ID of an assignment: prefix
// followed by the first 32 hex digits of SHA-256("gdr-spire-entry/v1\x00" +
// assignmentID). It is deterministic, so bind, re-bind and delete all address
// the same entry without storing its ID anywhere, and it reveals nothing but
// a hash. The characters are those SPIRE allows in an entry ID when prefix is
// valid (see validEntryIDPrefix).
func EntryID(prefix, assignmentID string) string {
	sum := sha256.Sum256([]byte("gdr-spire-entry/v1\x00" + assignmentID))
	return prefix + hex.EncodeToString(sum[:])[:entryIDHashLength]
}

// validEntryIDPrefix checks prefix against SPIRE's entry ID alphabet
// ([-._0-9A-Za-z]) and length limit.
func validEntryIDPrefix(prefix string) error {
	if prefix == "" {
		return errors.New("entry ID prefix is empty")
	}
	if len(prefix) > MaxEntryIDPrefixLength {
		return fmt.Errorf("entry ID prefix %q is longer than %d characters", prefix, MaxEntryIDPrefixLength)
	}
	for _, r := range prefix {
		ok := r == '-' || r == '.' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("entry ID prefix %q has %q: SPIRE allows only [-._0-9A-Za-z]", prefix, r)
		}
	}
	return nil
}

// agentID is the SPIFFE ID the SPIRE agent on a node gets from the k8s_psat
// node attestor: spiffe://<td>/spire/agent/k8s_psat/<cluster>/<node UID>.
func agentID(td spiffeid.TrustDomain, cluster, nodeUID string) (spiffeid.ID, error) {
	id, err := spiffeid.FromSegments(td, "spire", "agent", "k8s_psat", cluster, nodeUID)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("agent ID of node %q in cluster %q: %w", nodeUID, cluster, err)
	}
	return id, nil
}

// podEntry is the registration entry of a pod: its SPIFFE ID, issued to the
// workload with pod UID podUID in namespace ns, through the agent of its node.
// Both selectors must match (SPIRE ANDs them): the UID names the one Pod, the
// namespace lets the server's authorization policy confine task entries to
// the executors' namespace (deploy/spire/policy.rego).
func podEntry(entryID string, id, parent spiffeid.ID, ns, podUID string, expiresAt int64) *types.Entry {
	return &types.Entry{
		Id:       entryID,
		SpiffeId: &types.SPIFFEID{TrustDomain: id.TrustDomain().Name(), Path: id.Path()},
		ParentId: &types.SPIFFEID{TrustDomain: parent.TrustDomain().Name(), Path: parent.Path()},
		Selectors: []*types.Selector{
			{Type: "k8s", Value: "ns:" + ns},
			{Type: "k8s", Value: "pod-uid:" + podUID},
		},
		ExpiresAt: expiresAt,
	}
}

// entryMatch tells how an existing entry relates to the wanted one.
type entryMatch int

const (
	// entrySame: same SPIFFE ID, parent and selectors (expiry and other
	// fields are ignored): the binding is in place.
	entrySame entryMatch = iota
	// entryStale: same SPIFFE ID, other parent or selectors: the binding of
	// an earlier pod of the same assignment (same name, other UID).
	entryStale
	// entryForeign: another SPIFFE ID.
	entryForeign
)

func compareEntry(got, want *types.Entry) entryMatch {
	if spiffeString(got.GetSpiffeId()) != spiffeString(want.GetSpiffeId()) {
		return entryForeign
	}
	if spiffeString(got.GetParentId()) != spiffeString(want.GetParentId()) ||
		!slices.Equal(selectorStrings(got.GetSelectors()), selectorStrings(want.GetSelectors())) {
		return entryStale
	}
	return entrySame
}

func spiffeString(id *types.SPIFFEID) string {
	return "spiffe://" + id.GetTrustDomain() + id.GetPath()
}

func selectorStrings(ss []*types.Selector) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.GetType()+":"+s.GetValue())
	}
	slices.Sort(out)
	return out
}

// ensureEntry creates want, or accepts an existing entry with the same
// content (see entryMatch). A stale entry under want's ID (same SPIFFE ID,
// an earlier pod) is replaced. Anything else is ErrEntryConflict.
func ensureEntry(ctx context.Context, c EntryClient, want *types.Entry) error {
	for attempt := 0; ; attempt++ {
		res, err := createEntry(ctx, c, want)
		if err != nil {
			return err
		}
		switch codes.Code(res.GetStatus().GetCode()) {
		case codes.OK:
			return nil
		case codes.AlreadyExists:
		default:
			return fmt.Errorf("create SPIRE entry %s: %s: %s", want.Id, codes.Code(res.GetStatus().GetCode()), res.GetStatus().GetMessage())
		}
		// ALREADY_EXISTS comes in two forms: a similar entry (same SPIFFE ID,
		// parent and selectors) is returned as is, possibly under another ID;
		// a taken entry ID comes without an entry.
		if e := res.GetEntry(); e != nil && e.GetId() != want.Id {
			return fmt.Errorf("%w: entry %s already registers %s for these selectors; refusing to bind entry %s",
				ErrEntryConflict, e.GetId(), spiffeString(want.SpiffeId), want.Id)
		}
		got, err := c.GetEntry(ctx, &entryv1.GetEntryRequest{Id: want.Id})
		if status.Code(err) == codes.NotFound && attempt == 0 {
			continue // deleted in between: create again, once
		}
		if err != nil {
			return fmt.Errorf("get SPIRE entry %s: %w", want.Id, err)
		}
		switch compareEntry(got, want) {
		case entrySame:
			return nil
		case entryForeign:
			return fmt.Errorf("%w: entry %s registers %s, not %s", ErrEntryConflict, want.Id,
				spiffeString(got.GetSpiffeId()), spiffeString(want.SpiffeId))
		}
		if attempt > 0 {
			return fmt.Errorf("%w: entry %s keeps changing", ErrEntryConflict, want.Id)
		}
		if err := deleteEntry(ctx, c, want.Id); err != nil {
			return fmt.Errorf("replace stale SPIRE entry: %w", err)
		}
	}
}

func createEntry(ctx context.Context, c EntryClient, e *types.Entry) (*entryv1.BatchCreateEntryResponse_Result, error) {
	resp, err := c.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{e}})
	if err != nil {
		return nil, fmt.Errorf("create SPIRE entry %s: %w", e.Id, err)
	}
	if len(resp.GetResults()) != 1 {
		return nil, fmt.Errorf("create SPIRE entry %s: %d results for one entry", e.Id, len(resp.GetResults()))
	}
	return resp.GetResults()[0], nil
}

// deleteEntry deletes the entry id; an entry that does not exist is success.
func deleteEntry(ctx context.Context, c EntryClient, id string) error {
	resp, err := c.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: []string{id}})
	if err != nil {
		return fmt.Errorf("delete SPIRE entry %s: %w", id, err)
	}
	if len(resp.GetResults()) != 1 {
		return fmt.Errorf("delete SPIRE entry %s: %d results for one entry", id, len(resp.GetResults()))
	}
	switch st := resp.GetResults()[0].GetStatus(); codes.Code(st.GetCode()) {
	case codes.OK, codes.NotFound:
		return nil
	default:
		return fmt.Errorf("delete SPIRE entry %s: %s: %s", id, codes.Code(st.GetCode()), strings.TrimSpace(st.GetMessage()))
	}
}
