package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
)

// cacheFixture is a gateway with a cache, and the payloads of three tasks:
// 21 on alice/repo's main, 22 on bob/other's main, 23 on alice/repo's
// feature branch.
func cacheFixture(t testing.TB) fixture { return cacheFixtureOf(t, 1<<20) }

// cacheFixtureOf is cacheFixture with maxBytes per repository.
func cacheFixtureOf(t testing.TB, maxBytes int64) fixture {
	t.Helper()
	f := startWith(t, func(g *Gateway) {
		g.Cache = &actionscache.Cache{Storage: &actionscache.Dir{Path: t.TempDir()},
			Limits: actionscache.Limits{MaxBytes: maxBytes, MaxEntries: 10, MaxAge: time.Hour}}
	})
	repoIDs := map[string]int{"alice/repo": 7, "bob/other": 8}
	for id, task := range map[int64][2]string{21: {"alice/repo", "refs/heads/main"}, 22: {"bob/other", "refs/heads/main"}, 23: {"Alice/Repo", "refs/heads/feature"}} {
		c, err := structpb.NewStruct(map[string]any{"repository": task[0], "job": "build", "ref": task[1],
			"event": map[string]any{"repository": map[string]any{"id": repoIDs[strings.ToLower(task[0])], "default_branch": "main"}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.payloads.Put(context.Background(), "linux-"+strconv.FormatInt(id, 10), &runnerv1.Task{Id: id, Context: c}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// cacheProxy is the runner's cache proxy of an executor holding id's SVID
// and the capability of (assignment, its task).
func (f fixture) cacheProxy(t testing.TB, id spiffeid.ID, assignment, capability string) string {
	t.Helper()
	svid, err := f.ca.Mint(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, err := actionscache.StartProxy(f.url, NewTransport(Credentials{SVID: svid, Bundle: f.ca, AssignmentID: assignment, Capability: capability},
		tlsconfig.AuthorizeMemberOf(td)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p.URL
}

func (f fixture) ownCacheProxy(t *testing.T, repo string, n int64) string {
	id := spiffeid.RequireFromPath(td, "/repo/"+repo+"/task/"+strconv.FormatInt(n, 10))
	a := "linux-" + strconv.FormatInt(n, 10)
	return f.cacheProxy(t, id, a, f.boot.Capability(a, n, id.String()))
}

func call(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(data)
}

func cacheSave(t *testing.T, base, key, content string) int {
	t.Helper()
	status, body := call(t, "POST", base+"_apis/artifactcache/caches", fmt.Sprintf(`{"key":%q,"version":"v","cacheSize":%d}`, key, len(content)))
	if status != 200 {
		return status
	}
	id := strings.Trim(strings.TrimPrefix(strings.TrimSpace(body), `{"cacheId":`), "}")
	if status, body := call(t, "PATCH", base+"_apis/artifactcache/caches/"+id, content, "Content-Range", fmt.Sprintf("bytes 0-%d/*", len(content)-1)); status != 204 {
		t.Fatalf("upload: %d %s", status, body)
	}
	status, _ = call(t, "POST", base+"_apis/artifactcache/caches/"+id, fmt.Sprintf(`{"size":%d}`, len(content)))
	return status
}

// cacheRestore returns the lookup's status and the archive of a hit.
func cacheRestore(t *testing.T, base, key string) (int, string) {
	t.Helper()
	status, body := call(t, "GET", base+"_apis/artifactcache/cache?keys="+key+"&version=v", "")
	if status != 200 {
		return status, ""
	}
	_, loc, _ := strings.Cut(body, `"archiveLocation":"`)
	loc, _, _ = strings.Cut(loc, `"`)
	status, archive := call(t, "GET", loc, "")
	if status != 200 {
		t.Fatalf("download %s: %d", loc, status)
	}
	return 200, archive
}

func TestCacheIsScopedToTheCallersRepositoryAndBranch(t *testing.T) {
	f := cacheFixture(t)
	alice := f.ownCacheProxy(t, "alice/repo", 21)
	if status := cacheSave(t, alice, "deps", "alice's archive"); status != 204 {
		t.Fatalf("alice's save = %d", status)
	}
	if status, got := cacheRestore(t, alice, "deps"); status != 200 || got != "alice's archive" {
		t.Fatalf("alice's restore = %d %q", status, got)
	}
	bob := f.ownCacheProxy(t, "bob/other", 22)
	if status, got := cacheRestore(t, bob, "deps"); status != http.StatusNoContent {
		t.Fatalf("bob restored alice's entry: %d %q", status, got)
	}
	// alice's feature branch restores the default branch's entry; its own
	// save stays on its branch, where main does not see it.
	feature := f.ownCacheProxy(t, "alice/repo", 23)
	if status, got := cacheRestore(t, feature, "deps"); status != 200 || got != "alice's archive" {
		t.Fatalf("the feature branch's restore = %d %q", status, got)
	}
	if status := cacheSave(t, feature, "feature-only", "f"); status != 204 {
		t.Fatalf("the feature branch's save = %d", status)
	}
	if status, _ := cacheRestore(t, alice, "feature-only"); status != http.StatusNoContent {
		t.Fatalf("main restored the feature branch's entry: %d", status)
	}
}

func TestCacheRefusesCallersWithoutTheirTask(t *testing.T) {
	f := cacheFixture(t)
	alice := f.ownCacheProxy(t, "alice/repo", 21)
	if status := cacheSave(t, alice, "deps", "alice's archive"); status != 204 {
		t.Fatalf("alice's save = %d", status)
	}
	// A forged assignment: a valid SVID and capability for mallory/repo
	// with alice's task ID. The payload decides: 403.
	forged := spiffeid.RequireFromPath(td, "/repo/mallory/repo/task/21")
	mallory := f.cacheProxy(t, forged, "linux-21", f.boot.Capability("linux-21", 21, forged.String()))
	if status, got := cacheRestore(t, mallory, "deps"); status != http.StatusForbidden {
		t.Fatalf("a forged executor's restore = %d %q, want 403", status, got)
	}
	// alice's own SVID with a wrong capability: 401.
	id := spiffeid.RequireFromPath(td, "/repo/alice/repo/task/21")
	wrong := f.cacheProxy(t, id, "linux-21", "bm90LXRoZS1jYXBhYmlsaXR5")
	if status, _ := cacheRestore(t, wrong, "deps"); status != http.StatusUnauthorized {
		t.Fatalf("a wrong capability = %d, want 401", status)
	}
	// A caller without an SVID of the trust domain never completes the
	// handshake.
	res, err := http.Get(f.url + actionscache.PathPrefix + "cache?keys=deps&version=v")
	if err == nil {
		res.Body.Close()
		t.Fatalf("a caller without a client certificate got %d", res.StatusCode)
	}
	// And a wrong capability does not make the gateway read a large chunk.
	body := &countingBody{left: 64 << 20}
	req, _ := http.NewRequest("PATCH", wrong+"_apis/artifactcache/caches/1", body)
	req.Header.Set("Content-Range", fmt.Sprintf("bytes 0-%d/*", 64<<20-1))
	req.ContentLength = 64 << 20
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an unauthenticated upload = %d, want 401", res.StatusCode)
		}
	}
	if n := body.read.Load(); n > 16<<20 {
		t.Fatalf("%d bytes of an unauthenticated chunk were sent", n)
	}
}

func TestCacheScopeComesFromTheTask(t *testing.T) {
	for _, tc := range []struct {
		name    string
		context map[string]any
		want    actionscache.Scope
	}{
		{"a push to a feature branch", map[string]any{"repository": "Alice/Repo", "ref": "refs/heads/feature",
			"event": map[string]any{"repository": map[string]any{"id": 7, "default_branch": "main"}}},
			actionscache.Scope{Repository: "alice/repo", RepositoryID: 7, Ref: "refs/heads/feature", DefaultRef: "refs/heads/main"}},
		{"a pull request restores its base branch", map[string]any{"repository": "alice/repo", "ref": "refs/pull/3/head", "base_ref": "release",
			"event": map[string]any{"repository": map[string]any{"id": 7, "default_branch": "main"}}},
			actionscache.Scope{Repository: "alice/repo", RepositoryID: 7, Ref: "refs/pull/3/head", BaseRef: "refs/heads/release", DefaultRef: "refs/heads/main"}},
		{"no ref: the default branch", map[string]any{"repository": "alice/repo",
			"event": map[string]any{"repository": map[string]any{"id": 7, "default_branch": "trunk"}}},
			actionscache.Scope{Repository: "alice/repo", RepositoryID: 7, Ref: "refs/heads/trunk", DefaultRef: "refs/heads/trunk"}},
		// The cache then refuses the scope: no ID, no entries (never the name's).
		{"no repository ID in the event", map[string]any{"repository": "alice/repo", "ref": "refs/heads/main",
			"event": map[string]any{"repository": map[string]any{"default_branch": "main"}}},
			actionscache.Scope{Repository: "alice/repo", Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}},
		{"a repository ID that is not a positive integer", map[string]any{"repository": "alice/repo", "ref": "refs/heads/main",
			"event": map[string]any{"repository": map[string]any{"id": 7.5, "default_branch": "main"}}},
			actionscache.Scope{Repository: "alice/repo", Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := structpb.NewStruct(tc.context)
			if err != nil {
				t.Fatal(err)
			}
			if got := cacheScope(&runnerv1.Task{Id: 1, Context: c}); got != tc.want {
				t.Fatalf("cacheScope = %+v, want %+v", got, tc.want)
			}
		})
	}
}
