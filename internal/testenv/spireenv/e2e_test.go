//go:build e2e

package spireenv

import (
	"context"
	"testing"
	"time"

	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
)

func TestE2EServer(t *testing.T) {
	s := Start(t)
	if len(s.Socket) > 100 {
		t.Fatalf("socket path %q is too long for a unix socket", s.Socket)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := &types.Entry{
		Id:        "test-entry",
		SpiffeId:  &types.SPIFFEID{TrustDomain: TrustDomain, Path: "/workload"},
		ParentId:  &types.SPIFFEID{TrustDomain: TrustDomain, Path: "/spire/agent/join_token/x"},
		Selectors: []*types.Selector{{Type: "unix", Value: "uid:1000"}},
	}
	resp, err := s.Entries().BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{e}})
	if err != nil || codes.Code(resp.Results[0].Status.Code) != codes.OK {
		t.Fatalf("create entry: %v %v", resp, err)
	}
	if got := s.AllEntries(t); len(got) != 1 || got[0].Id != "test-entry" {
		t.Fatalf("entries %v", got)
	}
	// A second server is independent.
	if got := Start(t).AllEntries(t); len(got) != 0 {
		t.Fatalf("a fresh server has entries: %v", got)
	}
}
