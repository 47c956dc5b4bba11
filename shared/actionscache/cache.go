// Package actionscache is the cache service of actions/cache (the v1
// protocol of @actions/cache, ACTIONS_CACHE_URL) for ephemeral executors,
// scoped per repository by the caller's identity.
//
// Three parts: Cache holds the entries and their policy (scoping, GitHub's
// branch rule, per-repository limits with least-recently-used eviction) over
// a narrow Storage (Dir: a directory, a PersistentVolume in a cluster);
// Handler serves the protocol for a Scope the server derives from the
// caller's authenticated task (the gateway mounts it behind SPIFFE mTLS);
// Proxy is the loopback endpoint the runner serves inside the executor, which
// forwards each call over the runner's own mTLS connection.
//
// Invariants: a Scope never comes from a request; an entry is read only by
// its own repository, and only from a ref the scope may restore (its own,
// the pull request's base, the default branch); it is written only by its
// own ref; nothing a job sends names a repository or a path on disk.
//
// Why not act's pkg/artifactcache (Gitea's act fork): its Handler binds its
// own listener and hands out archive URLs naming it, keeps one bolthold
// database for all callers with no notion of a repository or ref, and runs a
// fixed garbage collection; here every call arrives already authenticated
// through the gateway, must be scoped to the caller's repository and branch,
// and the storage must be shared by stateless gateway replicas. The protocol
// itself is small (five calls), so it is implemented here.
package actionscache

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Scope is what a caller may see, derived from its authenticated task.
type Scope struct {
	// Repository is the lower-cased "owner/name" of the caller's task.
	Repository string
	// Ref is the task's ref (refs/heads/feature, refs/pull/3/head): what it
	// writes to, and what it restores first.
	Ref string
	// BaseRef is a pull request's base branch (refs/heads/main), restored
	// after Ref; empty for other events.
	BaseRef string
	// DefaultRef is the repository's default branch (refs/heads/main),
	// restored last.
	DefaultRef string
}

// readable is the refs the scope restores from, in GitHub's order.
func (s Scope) readable() []string {
	var refs []string
	for _, r := range []string{s.Ref, s.BaseRef, s.DefaultRef} {
		if r != "" && !slices.Contains(refs, r) {
			refs = append(refs, r)
		}
	}
	return refs
}

func (s Scope) check() error {
	if s.Repository == "" || s.Ref == "" {
		return fmt.Errorf("%w: scope without repository or ref", ErrInvalid)
	}
	return nil
}

// Limits bound each repository's cache.
type Limits struct {
	// MaxBytes is the most bytes of committed entries; the least recently
	// used go first. An entry larger than it is refused at reservation.
	MaxBytes int64
	// MaxEntries is the most committed entries.
	MaxEntries int
	// MaxAge removes an entry not used (saved or restored) for that long.
	MaxAge time.Duration
}

// Tunables of reservations: how long an upload may take from reservation to
// commit, how many may be under way per repository, and how many chunks one
// may have.
const (
	reservationTTL  = 2 * time.Hour
	maxReservations = 16
	maxParts        = 10000
)

// Errors of Cache, each one HTTP status of Handler.
var (
	ErrNotFound = errors.New("no such cache entry")
	ErrExists   = errors.New("the cache entry exists or is being created")
	ErrTooLarge = errors.New("the cache entry is over the repository's size limit")
	ErrInvalid  = errors.New("invalid cache request")
)

// Entry is one cache entry of a repository.
type Entry struct {
	ID        int64     `json:"id"`
	Key       string    `json:"key"`
	Version   string    `json:"version"`
	Ref       string    `json:"ref"`
	Size      int64     `json:"size"`
	Created   time.Time `json:"created"`
	Used      time.Time `json:"used"`
	Committed bool      `json:"committed"`
	// Declared is the size announced at reservation (0: unknown).
	Declared int64 `json:"declared,omitempty"`
	// Parts maps each uploaded chunk's offset to its length, until commit.
	Parts map[int64]int64 `json:"parts,omitempty"`
}

// Index is a repository's entries, as Storage keeps them.
type Index struct {
	Entries []Entry `json:"entries"`
}

func (ix *Index) find(id int64) *Entry {
	for i := range ix.Entries {
		if ix.Entries[i].ID == id {
			return &ix.Entries[i]
		}
	}
	return nil
}

// Storage keeps each repository's index and archives. Update runs f on the
// repository's index under a lock exclusive across every process sharing
// the storage, and saves the index only if f returns nil.
type Storage interface {
	Update(ctx context.Context, repo string, f func(*Index) error) error
	// WriteAt writes n bytes of r at offset off of entry id's archive,
	// creating it; fewer bytes is an error.
	WriteAt(ctx context.Context, repo string, id, off int64, r io.Reader, n int64) error
	// Open opens entry id's archive.
	Open(ctx context.Context, repo string, id int64) (io.ReadSeekCloser, error)
	// Remove deletes entry id's archive; a missing one is no error.
	Remove(ctx context.Context, repo string, id int64) error
}

// Cache is the cache service's policy over a Storage.
type Cache struct {
	Storage Storage
	Limits  Limits
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (c *Cache) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

// Lookup returns the entry a restore of keys (the primary key, then the
// restore keys) with version gets: for each readable ref in order (own,
// base, default), for each key, an exact match, else the newest entry whose
// key has it as prefix. It marks the entry used. ErrNotFound: a miss.
func (c *Cache) Lookup(ctx context.Context, s Scope, keys []string, version string) (Entry, error) {
	if err := s.check(); err != nil {
		return Entry{}, err
	}
	if len(keys) == 0 || version == "" || slices.Contains(keys, "") {
		return Entry{}, fmt.Errorf("%w: non-empty keys and a version are required", ErrInvalid)
	}
	var hit *Entry
	var evicted []int64
	err := c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		evicted = c.sweep(ix, 0)
		if e := match(ix, s, keys, version); e != nil {
			e.Used = c.now()
			h := *e
			hit = &h
		}
		return nil
	})
	if err != nil {
		return Entry{}, err
	}
	c.remove(ctx, s.Repository, evicted)
	if hit == nil {
		return Entry{}, ErrNotFound
	}
	return *hit, nil
}

func match(ix *Index, s Scope, keys []string, version string) *Entry {
	for _, ref := range s.readable() {
		for _, key := range keys {
			var best *Entry
			for i := range ix.Entries {
				e := &ix.Entries[i]
				if !e.Committed || e.Ref != ref || e.Version != version || !strings.HasPrefix(e.Key, key) {
					continue
				}
				if e.Key == key {
					best = e
					break
				}
				if best == nil || e.Created.After(best.Created) {
					best = e
				}
			}
			if best != nil {
				return best
			}
		}
	}
	return nil
}

// Reserve starts an entry of key and version on the scope's own ref, whose
// archive will be size bytes (0: unknown), and returns its ID.
func (c *Cache) Reserve(ctx context.Context, s Scope, key, version string, size int64) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if key == "" || version == "" || len(key) > 512 || len(version) > 512 || size < 0 {
		return 0, fmt.Errorf("%w: a key and a version (at most 512 bytes each) are required", ErrInvalid)
	}
	if size > c.Limits.MaxBytes {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, size, c.Limits.MaxBytes)
	}
	id, err := newID()
	if err != nil {
		return 0, err
	}
	var evicted []int64
	err = c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		evicted = c.sweep(ix, 0)
		pending := 0
		for _, e := range ix.Entries {
			if e.Key == key && e.Version == version && e.Ref == s.Ref {
				return fmt.Errorf("%w: key %q", ErrExists, key)
			}
			if !e.Committed {
				pending++
			}
		}
		if pending >= maxReservations {
			return fmt.Errorf("%w: %d uploads under way in this repository", ErrExists, pending)
		}
		now := c.now()
		ix.Entries = append(ix.Entries, Entry{ID: id, Key: key, Version: version, Ref: s.Ref,
			Created: now, Used: now, Declared: size})
		return nil
	})
	if err != nil {
		return 0, err
	}
	c.remove(ctx, s.Repository, evicted)
	return id, nil
}

// Upload writes the chunk [start, end] (inclusive, as Content-Range says)
// of entry id from body, which must hold exactly that many bytes. Only the
// ref that reserved the entry uploads to it, before its commit.
func (c *Cache) Upload(ctx context.Context, s Scope, id, start, end int64, body io.Reader) error {
	if err := s.check(); err != nil {
		return err
	}
	if start < 0 || end < start {
		return fmt.Errorf("%w: bad range %d-%d", ErrInvalid, start, end)
	}
	var limit int64
	err := c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		if len(e.Parts) >= maxParts {
			return fmt.Errorf("%w: more than %d chunks", ErrInvalid, maxParts)
		}
		limit = c.Limits.MaxBytes
		if e.Declared > 0 {
			limit = e.Declared
		}
		return nil
	})
	if err != nil {
		return err
	}
	if end >= limit {
		return fmt.Errorf("%w: chunk ends at %d, past %d bytes", ErrTooLarge, end, limit)
	}
	if err := c.Storage.WriteAt(ctx, s.Repository, id, start, body, end-start+1); err != nil {
		return fmt.Errorf("cache entry %d: %w", id, err)
	}
	return c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		if e.Parts == nil {
			e.Parts = map[int64]int64{}
		}
		e.Parts[start] = end - start + 1
		return nil
	})
}

func writable(ix *Index, s Scope, id int64) (*Entry, error) {
	e := ix.find(id)
	if e == nil || e.Ref != s.Ref {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if e.Committed {
		return nil, fmt.Errorf("%w: entry %d is committed", ErrExists, id)
	}
	return e, nil
}

// Commit ends entry id's upload: its chunks must cover exactly size bytes.
// Then the repository's least recently used entries are evicted until it is
// within its limits.
func (c *Cache) Commit(ctx context.Context, s Scope, id, size int64) error {
	if err := s.check(); err != nil {
		return err
	}
	var evicted []int64
	err := c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		if size <= 0 || size > c.Limits.MaxBytes || (e.Declared > 0 && size != e.Declared) {
			return fmt.Errorf("%w: size %d (declared %d)", ErrInvalid, size, e.Declared)
		}
		if err := covers(e.Parts, size); err != nil {
			return err
		}
		now := c.now()
		e.Committed, e.Size, e.Parts, e.Created, e.Used = true, size, nil, now, now
		evicted = c.sweep(ix, id)
		return nil
	})
	if err != nil {
		return err
	}
	c.remove(ctx, s.Repository, evicted)
	return nil
}

// covers checks that the chunks are exactly [0, size) without gap.
func covers(parts map[int64]int64, size int64) error {
	offs := make([]int64, 0, len(parts))
	for off := range parts {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	var next int64
	for _, off := range offs {
		if off > next {
			return fmt.Errorf("%w: bytes %d-%d were never uploaded", ErrInvalid, next, off-1)
		}
		next = max(next, off+parts[off])
	}
	if next != size {
		return fmt.Errorf("%w: %d bytes uploaded, commit says %d", ErrInvalid, next, size)
	}
	return nil
}

// Open returns entry id's archive and entry, if the scope may restore it.
func (c *Cache) Open(ctx context.Context, s Scope, id int64) (io.ReadSeekCloser, Entry, error) {
	if err := s.check(); err != nil {
		return nil, Entry{}, err
	}
	var got Entry
	err := c.Storage.Update(ctx, s.Repository, func(ix *Index) error {
		e := ix.find(id)
		if e == nil || !e.Committed || !slices.Contains(s.readable(), e.Ref) || c.expired(*e) {
			return fmt.Errorf("%w: %d", ErrNotFound, id)
		}
		got = *e
		return nil
	})
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := c.Storage.Open(ctx, s.Repository, id)
	if err != nil {
		return nil, Entry{}, fmt.Errorf("cache entry %d: %w", id, err)
	}
	return f, got, nil
}

func (c *Cache) expired(e Entry) bool {
	return c.Limits.MaxAge > 0 && c.now().Sub(e.Used) > c.Limits.MaxAge
}

// sweep drops abandoned reservations and expired entries, then the least
// recently used committed entries but keep (the entry just committed) until
// the index is within the limits, and returns the IDs whose archives are to
// be removed.
func (c *Cache) sweep(ix *Index, keep int64) []int64 {
	var gone []int64
	now := c.now()
	kept := ix.Entries[:0]
	for _, e := range ix.Entries {
		if (!e.Committed && now.Sub(e.Created) > reservationTTL) || (e.Committed && c.expired(e)) {
			gone = append(gone, e.ID)
			continue
		}
		kept = append(kept, e)
	}
	ix.Entries = kept
	for {
		var bytes int64
		entries := 0
		var lru *Entry
		for i := range ix.Entries {
			e := &ix.Entries[i]
			if !e.Committed {
				continue
			}
			bytes += e.Size
			entries++
			if e.ID == keep {
				continue
			}
			if lru == nil || e.Used.Before(lru.Used) || (e.Used.Equal(lru.Used) && e.ID < lru.ID) {
				lru = e
			}
		}
		if lru == nil || (bytes <= c.Limits.MaxBytes && (c.Limits.MaxEntries <= 0 || entries <= c.Limits.MaxEntries)) {
			break
		}
		id := lru.ID
		gone = append(gone, id)
		ix.Entries = slices.DeleteFunc(ix.Entries, func(e Entry) bool { return e.ID == id })
	}
	slices.SortFunc(ix.Entries, func(a, b Entry) int { return cmp.Compare(a.ID, b.ID) })
	return gone
}

// remove deletes the archives of entries no longer in the index; a failure
// leaves an orphan file, which no index names.
func (c *Cache) remove(ctx context.Context, repo string, ids []int64) {
	for _, id := range ids {
		_ = c.Storage.Remove(ctx, repo, id)
	}
}

// newID returns a random positive ID that JavaScript's numbers hold exactly
// (below 2^53).
func newID() (int64, error) {
	var b [8]byte
	if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])>>11) | 1, nil
}
