package actionscache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	mainA    = Scope{Repository: "alice/a", RepositoryID: 1, Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}
	featureA = Scope{Repository: "alice/a", RepositoryID: 1, Ref: "refs/heads/feature", DefaultRef: "refs/heads/main"}
	prA      = Scope{Repository: "alice/a", RepositoryID: 1, Ref: "refs/pull/3/head", BaseRef: "refs/heads/release", DefaultRef: "refs/heads/main"}
	mainB    = Scope{Repository: "bob/b", RepositoryID: 2, Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newCache(t *testing.T, l Limits) (*Cache, *clock) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if l.MaxBytes == 0 {
		l.MaxBytes = 1 << 30
	}
	return &Cache{Storage: &Dir{Path: t.TempDir()}, Limits: l, Now: clk.now}, clk
}

// save stores content under key as s, in two chunks, and returns its ID.
func save(t *testing.T, c *Cache, s Scope, key, content string) int64 {
	t.Helper()
	ctx := context.Background()
	id, err := c.Reserve(ctx, s, key, "v1", int64(len(content)))
	if err != nil {
		t.Fatalf("Reserve(%s, %s): %v", s.Ref, key, err)
	}
	half := int64(len(content) / 2)
	// the second half first: chunks arrive in any order
	if err := c.Upload(ctx, s, id, half, int64(len(content))-1, strings.NewReader(content[half:])); err != nil {
		t.Fatal(err)
	}
	if half > 0 {
		if err := c.Upload(ctx, s, id, 0, half-1, strings.NewReader(content[:half])); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Commit(ctx, s, id, int64(len(content))); err != nil {
		t.Fatal(err)
	}
	return id
}

// restore returns the content a restore of keys gets, or "" on a miss.
func restore(t *testing.T, c *Cache, s Scope, keys ...string) string {
	t.Helper()
	ctx := context.Background()
	e, err := c.Lookup(ctx, s, keys, "v1")
	if errors.Is(err, ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := c.Open(ctx, s, e.ID)
	if err != nil {
		t.Fatalf("Open of a hit: %v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestAnotherRepositorysEntryIsNeverServed(t *testing.T) {
	c, _ := newCache(t, Limits{})
	ctx := context.Background()
	id := save(t, c, mainA, "deps-1", "alice's secret build output")
	if got := restore(t, c, mainB, "deps-1"); got != "" {
		t.Fatalf("bob restored %q with alice's key", got)
	}
	if got := restore(t, c, mainB, "deps"); got != "" {
		t.Fatalf("bob restored %q with a prefix of alice's key", got)
	}
	// Knowing the ID does not help: the ID is looked up in bob's own index.
	if _, _, err := c.Open(ctx, mainB, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob opened alice's entry by ID: %v", err)
	}
	if err := c.Upload(ctx, mainB, id, 0, 0, strings.NewReader("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bob wrote to alice's entry: %v", err)
	}
	if got := restore(t, c, mainA, "deps-1"); got != "alice's secret build output" {
		t.Fatalf("alice restored %q", got)
	}
	// The same key in bob's repository is bob's own entry.
	save(t, c, mainB, "deps-1", "bob's")
	if got := restore(t, c, mainB, "deps-1"); got != "bob's" {
		t.Fatalf("bob restored %q", got)
	}
	if got := restore(t, c, mainA, "deps-1"); got != "alice's secret build output" {
		t.Fatalf("alice restored %q after bob saved", got)
	}
}

// alice/a is deleted and created again by that name: the new repository
// (another ID) restores nothing of the old one's, and saves its own.
func TestARecreatedRepositoryInheritsNothing(t *testing.T) {
	c, _ := newCache(t, Limits{MaxBytes: 1 << 20, MaxEntries: 10, MaxAge: time.Hour})
	save(t, c, mainA, "deps", "old repository's")
	recreated := mainA
	recreated.RepositoryID = 99
	if got := restore(t, c, recreated, "deps"); got != "" {
		t.Fatalf("the re-created repository restored %q of the deleted one", got)
	}
	save(t, c, recreated, "deps", "its own")
	if got := restore(t, c, recreated, "deps"); got != "its own" {
		t.Fatalf("restored %q", got)
	}
	if _, err := c.Lookup(context.Background(), Scope{Repository: "alice/a", Ref: "refs/heads/main"}, []string{"deps"}, "v1"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a scope without a repository ID = %v, want ErrInvalid", err)
	}
}

func TestBranchRestoreRule(t *testing.T) {
	c, _ := newCache(t, Limits{})
	save(t, c, mainA, "k-main", "from main")
	save(t, c, featureA, "k-feature", "from feature")
	save(t, c, Scope{Repository: "alice/a", RepositoryID: 1, Ref: "refs/heads/release", DefaultRef: "refs/heads/main"}, "k-release", "from release")
	save(t, c, featureA, "shared", "feature's shared")
	save(t, c, mainA, "shared", "main's shared")
	for _, tc := range []struct {
		name  string
		scope Scope
		keys  []string
		want  string
	}{
		{"a feature branch restores the default branch's entry", featureA, []string{"k-main"}, "from main"},
		{"a feature branch restores its own entry", featureA, []string{"k-feature"}, "from feature"},
		{"its own entry comes before the default branch's", featureA, []string{"shared"}, "feature's shared"},
		{"the default branch never restores a feature branch's entry", mainA, []string{"k-feature"}, ""},
		{"the default branch restores its own", mainA, []string{"shared"}, "main's shared"},
		{"a branch never restores a sibling branch's entry", featureA, []string{"k-release"}, ""},
		{"a pull request restores its base branch's entry", prA, []string{"k-release"}, "from release"},
		{"and the default branch's", prA, []string{"k-main"}, "from main"},
		{"but not another branch's", prA, []string{"k-feature"}, ""},
		{"a restore key matches by prefix", featureA, []string{"none", "k-"}, "from feature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := restore(t, c, tc.scope, tc.keys...); got != tc.want {
				t.Fatalf("restore(%s, %v) = %q, want %q", tc.scope.Ref, tc.keys, got, tc.want)
			}
		})
	}
	// Open enforces the rule too, not only Lookup.
	e, err := c.Lookup(context.Background(), featureA, []string{"k-feature"}, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Open(context.Background(), mainA, e.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("main opened feature's entry by ID: %v", err)
	}
}

func TestVersionMustMatchAndKeysBeNonEmpty(t *testing.T) {
	c, _ := newCache(t, Limits{})
	save(t, c, mainA, "k", "x")
	if _, err := c.Lookup(context.Background(), mainA, []string{"k"}, "v2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup of another version = %v", err)
	}
	// An empty key would be a prefix of every key.
	if _, err := c.Lookup(context.Background(), mainA, []string{"none", ""}, "v1"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Lookup with an empty key = %v, want invalid", err)
	}
}

func TestEvictionLeastRecentlyUsed(t *testing.T) {
	t.Run("bytes", func(t *testing.T) {
		c, clk := newCache(t, Limits{MaxBytes: 10, MaxEntries: 100, MaxAge: time.Hour})
		save(t, c, mainA, "one", "1111")
		clk.t = clk.t.Add(time.Second)
		save(t, c, mainA, "two", "2222")
		clk.t = clk.t.Add(time.Second)
		if restore(t, c, mainA, "one") == "" { // one is now more recently used than two
			t.Fatal("one is gone too early")
		}
		clk.t = clk.t.Add(time.Second)
		save(t, c, mainA, "three", "3333") // 12 bytes > 10: two goes
		if restore(t, c, mainA, "two") != "" {
			t.Fatal("two, the least recently used, was not evicted")
		}
		if restore(t, c, mainA, "one") == "" || restore(t, c, mainA, "three") == "" {
			t.Fatal("a recently used entry was evicted")
		}
		// Another repository's entries are not evicted for alice's.
		save(t, c, mainB, "b", "bbbbbbbb")
		if restore(t, c, mainA, "one") == "" {
			t.Fatal("bob's save evicted alice's entry")
		}
	})
	t.Run("entries", func(t *testing.T) {
		c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 2, MaxAge: time.Hour})
		for _, k := range []string{"a", "b", "c"} {
			save(t, c, mainA, k, k)
			clk.t = clk.t.Add(time.Second)
		}
		if restore(t, c, mainA, "a") != "" || restore(t, c, mainA, "b") != "b" || restore(t, c, mainA, "c") != "c" {
			t.Fatal("not the oldest entry evicted")
		}
	})
	t.Run("age", func(t *testing.T) {
		c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 100, MaxAge: time.Hour})
		save(t, c, mainA, "old", "x")
		clk.t = clk.t.Add(50 * time.Minute)
		save(t, c, mainA, "new", "y")
		clk.t = clk.t.Add(20 * time.Minute)
		if restore(t, c, mainA, "old") != "" {
			t.Fatal("an entry unused for longer than MaxAge was restored")
		}
		if restore(t, c, mainA, "new") != "y" {
			t.Fatal("a fresh entry expired")
		}
	})
	t.Run("archives are removed", func(t *testing.T) {
		c, _ := newCache(t, Limits{MaxBytes: 4, MaxEntries: 100, MaxAge: time.Hour})
		id := save(t, c, mainA, "one", "1111")
		save(t, c, mainA, "two", "2222")
		if _, err := c.Storage.Open(context.Background(), mainA.key(), id); err == nil {
			t.Fatal("the evicted entry's archive is still there")
		}
	})
}

func TestReserveAndCommitRules(t *testing.T) {
	ctx := context.Background()
	c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 10, MaxAge: time.Hour})
	if _, err := c.Reserve(ctx, mainA, "big", "v1", 101); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Reserve over the limit = %v", err)
	}
	id, err := c.Reserve(ctx, mainA, "k", "v1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, mainA, "k", "v1", 10); !errors.Is(err, ErrExists) {
		t.Fatalf("a second reservation of the same key = %v", err)
	}
	if err := c.Upload(ctx, featureA, id, 0, 4, strings.NewReader("01234")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another branch uploaded to main's reservation: %v", err)
	}
	if err := c.Upload(ctx, mainA, id, 5, 10, strings.NewReader("567890")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a chunk past the declared size = %v", err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 4, strings.NewReader("012")); err == nil {
		t.Fatal("a chunk shorter than its range was accepted")
	}
	if err := c.Upload(ctx, mainA, id, 5, 9, strings.NewReader("56789")); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx, mainA, id, 10); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a commit with a gap = %v", err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 4, strings.NewReader("01234")); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx, mainA, id, 9); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a commit of another size = %v", err)
	}
	if err := c.Commit(ctx, mainA, id, 10); err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 0, strings.NewReader("x")); !errors.Is(err, ErrExists) {
		t.Fatalf("an upload after the commit = %v", err)
	}
	if got := restore(t, c, mainA, "k"); got != "0123456789" {
		t.Fatalf("restored %q", got)
	}
	// An abandoned reservation goes after DefaultReservationTTL.
	stale, err := c.Reserve(ctx, mainA, "stale", "v1", 1)
	if err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(DefaultReservationTTL + time.Minute)
	if _, err := c.Reserve(ctx, mainA, "other", "v1", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, mainA, stale, 0, 0, strings.NewReader("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an upload to an abandoned reservation = %v", err)
	}
}

func TestReservationsPerRepositoryAreBounded(t *testing.T) {
	c, _ := newCache(t, Limits{MaxBytes: 100, MaxEntries: 1000, MaxAge: time.Hour})
	ctx := context.Background()
	for i := range maxReservations {
		if _, err := c.Reserve(ctx, mainA, "k"+string(rune('a'+i)), "v1", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Reserve(ctx, mainA, "one-more", "v1", 1); !errors.Is(err, ErrExists) {
		t.Fatalf("reservation %d = %v", maxReservations+1, err)
	}
	if _, err := c.Reserve(ctx, mainB, "one-more", "v1", 1); err != nil {
		t.Fatalf("another repository is not bounded by alice's uploads: %v", err)
	}
}

func TestDirKeepsNoPathFromTheRequest(t *testing.T) {
	d := &Dir{Path: t.TempDir()}
	for _, repo := range []string{"../../etc", "a/../../b"} {
		if !strings.HasPrefix(d.repoDir(repo), d.Path+"/") || strings.Contains(d.repoDir(repo)[len(d.Path):], "..") {
			t.Fatalf("repoDir(%q) = %s", repo, d.repoDir(repo))
		}
	}
	ctx := context.Background()
	if err := d.WriteAt(ctx, "r", 1, 0, bytes.NewReader(nil), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a write to an upload never created = %v, want fs.ErrNotExist", err)
	}
	if err := d.Create(ctx, "r", 1); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(ctx, "r", 1, 0, bytes.NewReader(nil), 0); err != nil {
		t.Fatal(err)
	}
}

// Two gateway replicas share one directory (a ReadWriteMany volume): the
// flock around each index update keeps every save of both.
func TestReplicasSharingADirectoryLoseNoUpdate(t *testing.T) {
	dir := t.TempDir()
	limits := Limits{MaxBytes: 1 << 20, MaxEntries: 1000, MaxAge: time.Hour}
	replicas := []*Cache{{Storage: &Dir{Path: dir}, Limits: limits}, {Storage: &Dir{Path: dir}, Limits: limits}}
	const each = maxReservations / 2 // all under way at once, within the per-repository bound
	errs := make(chan error, 2*each)
	var wg sync.WaitGroup
	for r, c := range replicas {
		for i := range each {
			wg.Go(func() {
				ctx := context.Background()
				key := fmt.Sprintf("r%d-%d", r, i)
				id, err := c.Reserve(ctx, mainA, key, "v1", 1)
				if err == nil {
					err = c.Upload(ctx, mainA, id, 0, 0, strings.NewReader("x"))
				}
				if err == nil {
					err = c.Commit(ctx, mainA, id, 1)
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for r := range replicas {
		for i := range each {
			key := fmt.Sprintf("r%d-%d", r, i)
			if _, err := replicas[1-r].Lookup(context.Background(), mainA, []string{key}, "v1"); err != nil {
				t.Fatalf("%s saved through replica %d is lost: %v", key, r, err)
			}
		}
	}
}
