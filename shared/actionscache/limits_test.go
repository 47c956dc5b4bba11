package actionscache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Sixteen uploads under way at once, each as large as the limit, then
// abandoned: before, each was allowed up to the limit and none counted.
func TestConcurrentAbandonedReservationsStayWithinTheLimit(t *testing.T) {
	const limit = 100
	for _, tc := range []struct {
		name     string
		declared int64 // 0: unknown, grown chunk by chunk
		chunk    int64
	}{
		{"declared size", limit, limit},
		{"unknown size", 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newCache(t, Limits{MaxBytes: limit, MaxEntries: 100, MaxAge: time.Hour})
			ctx := context.Background()
			var wg sync.WaitGroup
			for i := range maxReservations {
				wg.Go(func() {
					id, err := c.Reserve(ctx, mainA, fmt.Sprintf("k%d", i), "v1", tc.declared)
					if err != nil {
						return
					}
					for off := int64(0); off < limit; off += tc.chunk {
						if c.Upload(ctx, mainA, id, off, off+tc.chunk-1, strings.NewReader(strings.Repeat("x", int(tc.chunk)))) != nil {
							return
						}
					}
				}) // and never committed
			}
			wg.Wait()
			d := c.Storage.(*Dir)
			if got := onDisk(t, d, mainA.key()); got > limit {
				t.Fatalf("abandoned uploads hold %d bytes on disk, the repository's limit is %d", got, limit)
			}
			if got := indexOf(t, d, mainA.key()).Usage().Bytes; got > limit {
				t.Fatalf("the repository is charged %d bytes, the limit is %d", got, limit)
			}
		})
	}
}

// A reservation makes room as a commit does: the least recently used
// committed entry goes, not a more recent one.
func TestReservationEvictsTheLeastRecentlyUsedEntry(t *testing.T) {
	c, clk := newCache(t, Limits{MaxBytes: 10, MaxEntries: 100, MaxAge: time.Hour})
	save(t, c, mainA, "old", "1111")
	clk.t = clk.t.Add(time.Second)
	save(t, c, mainA, "new", "2222")
	clk.t = clk.t.Add(time.Second)
	if _, err := c.Reserve(context.Background(), mainA, "big", "v1", 5); err != nil {
		t.Fatal(err)
	}
	if restore(t, c, mainA, "old") != "" || restore(t, c, mainA, "new") != "2222" {
		t.Fatal("the reservation did not evict the least recently used entry alone")
	}
	if _, err := c.Reserve(context.Background(), mainA, "bigger", "v1", 6); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a reservation past what uploads under way leave = %v, want ErrTooLarge", err)
	}
}

// Repository A's abandoned upload goes after its TTL at a call of
// repository B: A never calls again.
func TestAbandonedReservationIsRemovedByAnotherRepository(t *testing.T) {
	const ttl = 10 * time.Minute
	c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 100, MaxAge: 24 * time.Hour, ReservationTTL: ttl})
	ctx := context.Background()
	d := c.Storage.(*Dir)
	id, err := c.Reserve(ctx, mainA, "abandoned", "v1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 4, strings.NewReader("01234")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after time.Duration
		gone  bool
	}{
		{ttl - time.Minute, false},
		{ttl + time.Minute, true},
	} {
		clk.t = clk.t.Add(tc.after - clk.t.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
		if _, err := c.Reserve(ctx, mainB, fmt.Sprintf("b-%s", tc.after), "v1", 1); err != nil {
			t.Fatal(err)
		}
		held := indexOf(t, d, mainA.key()).find(id) != nil
		_, statErr := os.Stat(d.archive(mainA.key(), id))
		_, partsErr := os.Stat(d.parts(mainA.key(), id))
		if tc.gone && (held || !errors.Is(statErr, fs.ErrNotExist) || !errors.Is(partsErr, fs.ErrNotExist)) {
			t.Fatalf("%s after its reservation, A's abandoned upload is still there (in the index: %v, archive: %v, chunks: %v)", tc.after, held, statErr, partsErr)
		}
		if !tc.gone && !held {
			t.Fatalf("%s after its reservation, within its TTL, A's upload was removed", tc.after)
		}
	}
}

func TestGlobalLimitEvictsLeastRecentlyUsedAcrossRepositories(t *testing.T) {
	mainC := Scope{Repository: "carol/c", RepositoryID: 3, Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}
	type step struct {
		save    bool // else restore
		scope   Scope
		key     string
		content string
	}
	for _, tc := range []struct {
		name  string
		total int64
		steps []step
		gone  map[Scope][]string // scope: keys evicted
		kept  map[Scope][]string
	}{
		{
			name:  "the least recently used of another repository goes, not a more recently used one",
			total: 10,
			steps: []step{{true, mainA, "one", "1111"}, {true, mainB, "two", "2222"}, {false, mainA, "one", ""}, {true, mainC, "three", "3333"}},
			gone:  map[Scope][]string{mainB: {"two"}},
			kept:  map[Scope][]string{mainA: {"one"}, mainC: {"three"}},
		},
		{
			name:  "several entries of one repository go before a more recently used one elsewhere",
			total: 8,
			steps: []step{{true, mainA, "a1", "11"}, {true, mainA, "a2", "22"}, {true, mainB, "b1", "bbbb"}, {true, mainC, "c1", "cccc"}},
			gone:  map[Scope][]string{mainA: {"a1", "a2"}},
			kept:  map[Scope][]string{mainB: {"b1"}, mainC: {"c1"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 100, MaxAge: time.Hour, MaxTotalBytes: tc.total})
			for _, s := range tc.steps {
				clk.t = clk.t.Add(time.Second)
				if s.save {
					save(t, c, s.scope, s.key, s.content)
				} else if restore(t, c, s.scope, s.key) == "" {
					t.Fatalf("%s was evicted too early", s.key)
				}
			}
			for s, keys := range tc.gone {
				for _, key := range keys {
					if restore(t, c, s, key) != "" {
						t.Errorf("%s of %s, the least recently used, was not evicted", key, s.Repository)
					}
				}
			}
			for s, keys := range tc.kept {
				for _, key := range keys {
					if restore(t, c, s, key) == "" {
						t.Errorf("%s of %s, more recently used, was evicted", key, s.Repository)
					}
				}
			}
			if total := charged(t, c); total > tc.total {
				t.Fatalf("the cache holds %d bytes, the global limit is %d", total, tc.total)
			}
		})
	}
}

// A chunk's record goes to the upload's own chunk file: the index is
// replaced only when an upload of unknown size outgrows its grant, which
// doubles each time.
func TestChunkUploadDoesNotRewriteTheIndex(t *testing.T) {
	for _, tc := range []struct {
		name        string
		declared    int64
		maxRewrites int
	}{
		{"declared size", 64, 0},
		{"unknown size", 0, 7}, // grants of 1, 2, 4, ... 64 bytes
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newCache(t, Limits{MaxBytes: 1000, MaxEntries: 100, MaxAge: time.Hour})
			ctx := context.Background()
			id, err := c.Reserve(ctx, mainA, "k", "v1", tc.declared)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(c.Storage.(*Dir).repoDir(mainA.key()), "index.json")
			// Replaced by rename: another inode (unless the file system reuses
			// the old one at once), another time or other bytes.
			type version struct {
				info os.FileInfo
				data []byte
			}
			read := func() version {
				info, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				data, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				return version{info, data}
			}
			before := read()
			rewrites := 0
			for off := int64(0); off < 64; off++ {
				if err := c.Upload(ctx, mainA, id, off, off, strings.NewReader("x")); err != nil {
					t.Fatal(err)
				}
				after := read()
				if !os.SameFile(before.info, after.info) || !before.info.ModTime().Equal(after.info.ModTime()) || !bytes.Equal(before.data, after.data) {
					rewrites++
					before = after
				}
			}
			if rewrites > tc.maxRewrites {
				t.Fatalf("64 chunks rewrote the index %d times, want at most %d", rewrites, tc.maxRewrites)
			}
			if err := c.Commit(ctx, mainA, id, 64); err != nil {
				t.Fatal(err)
			}
			if got := restore(t, c, mainA, "k"); got != strings.Repeat("x", 64) {
				t.Fatalf("restored %q", got)
			}
			if _, err := os.Stat(c.Storage.(*Dir).parts(mainA.key(), id)); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the committed entry's chunk records are left: %v", err)
			}
		})
	}
}

// The process dies mid-upload, and in the windows its files and indexes
// allow: after a restart (a new Cache and Dir on the same directory) what
// it left is counted at least at what it holds, and goes when it should.
func TestCrashLeavesNothingCountedWrongly(t *testing.T) {
	ctx := context.Background()
	c, clk := newCache(t, Limits{MaxBytes: 100, MaxEntries: 100, MaxAge: 24 * time.Hour, MaxTotalBytes: 1000})
	path := c.Storage.(*Dir).Path
	// Mid-upload: 30 of 60 bytes written, one chunk's bytes without its
	// record (gone between WriteAt and AddPart), a torn record.
	id, err := c.Reserve(ctx, mainA, "crashed", "v1", 60)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 29, strings.NewReader(strings.Repeat("x", 30))); err != nil {
		t.Fatal(err)
	}
	d := c.Storage.(*Dir)
	if err := d.WriteAt(ctx, mainA.key(), id, 30, strings.NewReader("yyyyy"), 5); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(d.parts(mainA.key(), id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte{0, 0, 0})
	_ = f.Close()
	// Gone between saving an index without an entry and removing its file.
	orphan := filepath.Join(d.repoDir(mainA.key()), "12345.archive")
	if err := os.WriteFile(orphan, []byte(strings.Repeat("o", 50)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Gone between writing B's grown usage.json and its index.json.
	save(t, c, mainB, "b", "bb")
	stale := Usage{Repository: mainB.key(), Bytes: 50, LRU: clk.t, OldestUpload: clk.t}
	if err := replaceFile(filepath.Join(d.repoDir(mainB.key()), "usage.json"), mustJSON(t, stale)); err != nil {
		t.Fatal(err)
	}

	restarted := &Cache{Storage: &Dir{Path: path}, Limits: c.Limits, Now: clk.now}
	if _, err := restarted.Reserve(ctx, mainA, "next", "v1", 50); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("after the restart, a reservation past what the crashed upload holds = %v, want ErrTooLarge", err)
	}
	total := func() int64 { return charged(t, restarted) }
	if got := total(); got < 60+2 {
		t.Fatalf("after the restart the cache counts %d bytes, less than the 62 its indexes hold", got)
	}
	// The crashed upload can be finished: the unrecorded chunk is a gap
	// until it is sent again, the torn record is ignored.
	if err := restarted.Commit(ctx, mainA, id, 60); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a commit over an unrecorded chunk = %v, want ErrInvalid", err)
	}
	if err := restarted.Upload(ctx, mainA, id, 30, 59, strings.NewReader(strings.Repeat("y", 30))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Fatal("the orphan went before any prune")
	}
	if err := restarted.Commit(ctx, mainA, id, 60); err != nil {
		t.Fatal(err)
	}
	if got := restore(t, restarted, mainA, "crashed"); got != strings.Repeat("x", 30)+strings.Repeat("y", 30) {
		t.Fatalf("restored %q", got)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the commit left the orphan archive the crash left: %v", err)
	}
	// After the TTL, a reservation of another repository corrects B's
	// stale usage.json; every count is then what the indexes hold.
	clk.t = clk.t.Add(DefaultReservationTTL + time.Minute)
	if _, err := restarted.Reserve(ctx, mainSecond, "k", "v1", 1); err != nil {
		t.Fatal(err)
	}
	if got := total(); got != 60+2+1 {
		t.Fatalf("the cache counts %d bytes, its indexes hold 63", got)
	}
	if got := onDisk(t, d, mainA.key()); got != 60 {
		t.Fatalf("A's archives hold %d bytes, its index 60", got)
	}
}

var mainSecond = Scope{Repository: "dave/d", RepositoryID: 4, Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}

// cutReader yields n bytes of x, then fails as a connection cut mid-body.
type cutReader struct{ n int }

func (r *cutReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := min(len(p), r.n)
	copy(p, bytes.Repeat([]byte("x"), k))
	r.n -= k
	return k, nil
}

// volumeBytes is what the files under path hold: every archive, chunk
// record, index and usage file, as stat sees them (not as an index counts).
func volumeBytes(t *testing.T, path string) (archives, all int64) {
	t.Helper()
	err := filepath.WalkDir(path, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		st, err := de.Info()
		if err != nil {
			return err
		}
		all += st.Size()
		if strings.HasSuffix(p, ".archive") {
			archives += st.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return archives, all
}

// One entry in each of eight repositories: a chunk cut short writes nearly
// the repository's limit, a one-byte chunk is recorded, and the commit says
// one byte. Before, each archive kept the cut chunk's bytes while its
// repository was charged one: eight of them held four times the global
// limit on disk.
func TestCutChunksLeaveNoBytesPastTheCharge(t *testing.T) {
	const limit, total = 64 << 10, 128 << 10
	c, _ := newCache(t, Limits{MaxBytes: limit, MaxEntries: 100, MaxAge: time.Hour, MaxTotalBytes: total})
	ctx := context.Background()
	for i := range 8 {
		s := Scope{Repository: fmt.Sprintf("mallory/r%d", i), RepositoryID: int64(100 + i), Ref: "refs/heads/main", DefaultRef: "refs/heads/main"}
		id, err := c.Reserve(ctx, s, "k", "v1", 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Upload(ctx, s, id, 0, 0, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		// The fault: the body ends 1 byte short of its range.
		err = c.Upload(ctx, s, id, 1, limit-1, &cutReader{n: limit - 2})
		if err == nil {
			t.Fatal("a chunk cut short was accepted")
		}
		if err := c.Commit(ctx, s, id, 1); err != nil {
			t.Fatalf("commit of the recorded byte: %v", err)
		}
	}
	archives, all := volumeBytes(t, c.Storage.(*Dir).Path)
	if got := charged(t, c); archives > got {
		t.Fatalf("the archives hold %d bytes on disk, the cache charges %d", archives, got)
	}
	if all > total+16<<10 {
		t.Fatalf("the volume holds %d bytes, the global limit is %d", all, total)
	}
}

// A chunk still being written when its upload commits: before, the commit
// did not wait for it, and its bytes landed in the committed archive past
// its size (and changed what restores read).
func TestChunkInFlightAtCommitCannotOutgrowTheEntry(t *testing.T) {
	const limit = 64 << 10
	c, _ := newCache(t, Limits{MaxBytes: limit, MaxEntries: 100, MaxAge: time.Hour})
	ctx := context.Background()
	id, err := c.Reserve(ctx, mainA, "k", "v1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, mainA, id, 0, 0, strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	uploaded := make(chan error, 1)
	go func() { uploaded <- c.Upload(ctx, mainA, id, 1, limit-1, pr) }()
	half := bytes.Repeat([]byte("x"), limit/2)
	if _, err := pw.Write(half); err != nil { // the chunk is under way
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- c.Commit(ctx, mainA, id, 1) }()
	select {
	case err := <-committed:
		t.Fatalf("the commit returned (%v) while a chunk of its upload was being written", err)
	case <-time.After(300 * time.Millisecond): // it waits for the chunk
	}
	_, _ = pw.Write(half[:limit/2-2]) // the rest but one byte, then the cut
	_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	if err := <-uploaded; err == nil {
		t.Fatal("a chunk cut short was accepted")
	}
	if err := <-committed; err != nil {
		t.Fatalf("commit of the recorded byte: %v", err)
	}
	archives, _ := volumeBytes(t, c.Storage.(*Dir).Path)
	if got := charged(t, c); archives > got {
		t.Fatalf("the archives hold %d bytes on disk, the cache charges %d", archives, got)
	}
	if got := restore(t, c, mainA, "k"); got != "a" {
		t.Fatalf("restored %q, want the committed byte", got)
	}
}
