// Package actionscache is the cache service of actions/cache (the v1
// protocol of @actions/cache, ACTIONS_CACHE_URL) for ephemeral executors,
// scoped per repository by the caller's identity.
//
// Three parts: Cache holds the entries and their policy (scoping, GitHub's
// branch rule, per-repository and global limits with least-recently-used
// eviction) over a narrow Storage (Dir: a directory, a PersistentVolume in a
// cluster);
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
// Accounting: a repository is charged the sizes of its committed entries
// plus what each upload under way holds (its declared size, or for an
// upload of unknown size a grant that doubles as its chunks need it). Both a
// repository's charge and the sum over all repositories stay within their
// limits after every completed call: a reservation, or a chunk that needs a
// larger grant, first evicts least recently used committed entries and is
// refused if uploads under way alone would pass a limit. An abandoned
// upload keeps its charge until Limits.ReservationTTL after its reservation;
// then the next reservation of any repository removes it.
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
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scope is what a caller may see, derived from its authenticated task.
type Scope struct {
	// Repository is the lower-cased "owner/name" of the caller's task, for
	// what the cache logs.
	Repository string
	// RepositoryID is Gitea's ID of that repository: what the entries are
	// kept under. A repository deleted and created again by its name has
	// another ID, and inherits nothing; a renamed one keeps its entries.
	RepositoryID int64
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
	if s.RepositoryID <= 0 || s.Ref == "" {
		return fmt.Errorf("%w: scope of %q without a repository ID or a ref", ErrInvalid, s.Repository)
	}
	return nil
}

// key is what Storage keeps the scope's repository under.
func (s Scope) key() string { return "id/" + strconv.FormatInt(s.RepositoryID, 10) }

// Limits bound the cache. A repository is charged the sizes of its committed
// entries plus what its uploads under way hold (Entry.charge).
type Limits struct {
	// MaxBytes is the most bytes a repository is charged; its least recently
	// used committed entries go first. An entry larger than it is refused at
	// reservation.
	MaxBytes int64
	// MaxEntries is the most committed entries of a repository.
	MaxEntries int
	// MaxAge removes an entry not used (saved or restored) for that long.
	MaxAge time.Duration
	// MaxTotalBytes is the most bytes charged across all repositories; the
	// least recently used committed entries of any repository go first.
	// 0: no global limit.
	MaxTotalBytes int64
	// ReservationTTL is how long an upload may take from reservation to
	// commit; then it is removed, by whichever repository reserves next.
	// 0: DefaultReservationTTL.
	ReservationTTL time.Duration
}

// DefaultReservationTTL is Limits.ReservationTTL's default.
const DefaultReservationTTL = time.Hour

// Tunables of reservations: how many uploads may be under way per
// repository, and how many chunks one may have.
const (
	maxReservations = 16
	maxParts        = 10000
)

// Errors of Cache, each one HTTP status of Handler.
var (
	ErrNotFound = errors.New("no such cache entry")
	ErrExists   = errors.New("the cache entry exists or is being created")
	ErrTooLarge = errors.New("the cache entry is over the cache's size limit")
	ErrInvalid  = errors.New("invalid cache request")
)

// Entry is one cache entry of a repository: committed, or an upload under
// way (a reservation).
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
	// Held is the grant of an upload of unknown size: what its chunks have
	// needed so far, doubled as they need more. 0 once committed.
	Held int64 `json:"held,omitempty"`
}

// charge is what the entry counts against the limits: a committed entry
// its size, an upload under way the most its archive may grow to (its
// declared size, or its grant). Its archive never holds more.
func (e Entry) charge() int64 {
	if e.Committed {
		return e.Size
	}
	return max(e.Declared, e.Held)
}

// Index is a repository's entries, as Storage keeps them. The chunks of an
// upload under way are not in it (Storage.AddPart), so that a chunk does not
// rewrite it.
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

// Usage is a repository's index summed up for the global limit.
type Usage struct {
	// Repository is the key Storage keeps the repository under (Scope's
	// key, or before keys by ID its name); empty when Storage cannot tell
	// (an index saved before usage was kept): counted, never swept.
	Repository string `json:"repository"`
	// Bytes is the repository's charge.
	Bytes int64 `json:"bytes"`
	// LRU is when its least recently used committed entry was last used
	// (zero: none).
	LRU time.Time `json:"lru,omitzero"`
	// OldestUpload is when its oldest upload under way was reserved (zero:
	// none).
	OldestUpload time.Time `json:"oldestUpload,omitzero"`
}

// Usage sums the index up; Repository is left empty.
func (ix *Index) Usage() Usage {
	var u Usage
	for _, e := range ix.Entries {
		u.Bytes += e.charge()
		switch {
		case e.Committed && (u.LRU.IsZero() || e.Used.Before(u.LRU)):
			u.LRU = e.Used
		case !e.Committed && (u.OldestUpload.IsZero() || e.Created.Before(u.OldestUpload)):
			u.OldestUpload = e.Created
		}
	}
	return u
}

// Storage keeps each repository's index, archives and chunk records, each
// repository's Usage, and a storage-wide lock.
//
// Locks: Update, AddPart and Prune hold the repository's lock, exclusive
// across every process sharing the storage; Lock takes the storage-wide
// one; LockUpload an upload's. The order is upload, storage-wide,
// repository: a holder of one may take those after it, never one before.
//
// Crash model: the process may die between any two steps (killed, OOM);
// what it wrote stays. Invariant: a repository's Usage never counts fewer
// bytes than its saved index charges, crash included.
type Storage interface {
	// Update runs f on the repository's index under its lock, and saves the
	// index only if f returns nil and changed it. Once it returns nil, the
	// repository's Usage is what the index sums up to.
	Update(ctx context.Context, repo string, f func(*Index) error) error
	// Create creates upload id's archive, empty. Only Create creates an
	// archive: WriteAt and LockUpload of an archive that is gone (its
	// upload removed) fail with fs.ErrNotExist, and leave nothing behind.
	Create(ctx context.Context, repo string, id int64) error
	// LockUpload takes upload id's lock, shared (a chunk being written) or
	// exclusive (its commit), and returns its release. It is taken before
	// any other lock of the storage. Dying releases it.
	LockUpload(ctx context.Context, repo string, id int64, exclusive bool) (func(), error)
	// WriteAt writes n bytes of r at offset off of entry id's archive;
	// fewer bytes is an error.
	WriteAt(ctx context.Context, repo string, id, off int64, r io.Reader, n int64) error
	// Truncate cuts entry id's archive to size bytes. It takes no lock: it
	// is called within Update.
	Truncate(ctx context.Context, repo string, id, size int64) error
	// AddPart records, under the repository's lock, that bytes
	// [off, off+n) of upload id are in its archive. ErrNotFound if the
	// index no longer has id (the archive is then removed), ErrExists if
	// it is committed, ErrInvalid past max chunks.
	AddPart(ctx context.Context, repo string, id, off, n int64, max int) error
	// Parts returns the chunks AddPart recorded for id, offset to length.
	// It takes no lock: it may be called within Update.
	Parts(ctx context.Context, repo string, id int64) (map[int64]int64, error)
	// Open opens entry id's archive.
	Open(ctx context.Context, repo string, id int64) (io.ReadSeekCloser, error)
	// Remove deletes entry id's archive and chunk records; missing ones are
	// no error.
	Remove(ctx context.Context, repo string, id int64) error
	// Prune deletes, under the repository's lock, what its index no longer
	// needs: archives of entries it does not name, chunk records of entries
	// that are not uploads under way (a crash between saving the index and
	// removing them leaves such files).
	Prune(ctx context.Context, repo string) error
	// Lock takes the storage-wide lock; the function returned releases it.
	Lock(ctx context.Context) (func(), error)
	// Usage returns every repository's Usage.
	Usage(ctx context.Context) ([]Usage, error)
}

// Cache is the cache service's policy over a Storage.
//
// Invariant (the limits): after every call that returns, each repository's
// charge is within Limits.MaxBytes and the sum within Limits.MaxTotalBytes.
// Only Reserve and an upload of unknown size outgrowing its grant add to a
// charge; both hold the storage-wide lock from their check to the end of
// their eviction, so that two of them never both pass one check. Crash
// window: a process that dies after saving a new reservation and before the
// global eviction leaves the total over by that reservation until the next
// reservation's eviction (of any repository) restores it.
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

func (c *Cache) ttl() time.Duration {
	if c.Limits.ReservationTTL <= 0 {
		return DefaultReservationTTL
	}
	return c.Limits.ReservationTTL
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
	err := c.Storage.Update(ctx, s.key(), func(ix *Index) error {
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
	c.remove(ctx, s.key(), evicted)
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
// archive will be size bytes (0: unknown), and returns its ID. The upload
// is charged its size from now until its commit or its TTL: committed
// entries are evicted to make room, and ErrTooLarge refuses it if uploads
// under way leave none (in the repository, or across repositories).
func (c *Cache) Reserve(ctx context.Context, s Scope, key, version string, size int64) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if key == "" || version == "" || len(key) > 512 || len(version) > 512 || size < 0 {
		return 0, fmt.Errorf("%w: a key and a version (at most 512 bytes each) are required", ErrInvalid)
	}
	if limit := c.Limits.MaxBytes; size > limit || (c.Limits.MaxTotalBytes > 0 && size > c.Limits.MaxTotalBytes) {
		if c.Limits.MaxTotalBytes > 0 {
			limit = min(limit, c.Limits.MaxTotalBytes)
		}
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, size, limit)
	}
	id, err := newID()
	if err != nil {
		return 0, err
	}
	unlock, err := c.Storage.Lock(ctx)
	if err != nil {
		return 0, err
	}
	defer unlock()
	err = c.admit(ctx, s.key(), func(ix *Index) error {
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
	err = c.Storage.Create(ctx, s.key(), id)
	if err == nil {
		err = c.makeRoom(ctx)
	}
	if err != nil {
		c.undo(ctx, s.key(), id, func(ix *Index) {
			ix.Entries = slices.DeleteFunc(ix.Entries, func(e Entry) bool { return e.ID == id })
		})
		_ = c.Storage.Remove(ctx, s.key(), id)
		return 0, err
	}
	return id, nil
}

// admit runs grow on repo's swept index, then evicts the least recently
// used committed entries until the repository is within its limits, and
// refuses the change with ErrTooLarge if its uploads under way alone pass
// MaxBytes. The caller holds the storage-wide lock.
func (c *Cache) admit(ctx context.Context, repo string, grow func(*Index) error) error {
	var evicted []int64
	err := c.Storage.Update(ctx, repo, func(ix *Index) error {
		evicted = c.sweep(ix, 0)
		if err := grow(ix); err != nil {
			return err
		}
		evicted = append(evicted, c.sweep(ix, 0)...)
		if b := ix.Usage().Bytes; b > c.Limits.MaxBytes {
			return fmt.Errorf("%w: uploads under way would hold %d bytes of the repository's %d", ErrTooLarge, b, c.Limits.MaxBytes)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.remove(ctx, repo, evicted)
	return nil
}

// undo reverts what admit let upload id grow by, when the global limit
// refuses it; a failure leaves it to its TTL.
func (c *Cache) undo(ctx context.Context, repo string, id int64, f func(*Index)) {
	_ = c.Storage.Update(ctx, repo, func(ix *Index) error {
		if e := ix.find(id); e == nil || e.Committed {
			return nil
		}
		f(ix)
		return nil
	})
}

// Upload writes the chunk [start, end] (inclusive, as Content-Range says)
// of entry id from body, which must hold exactly that many bytes. Only the
// ref that reserved the entry uploads to it, before its commit. A chunk
// reads the index but does not rewrite it: its record goes to
// Storage.AddPart; only an upload of unknown size rewrites the index, when a
// chunk outgrows its grant (which then at least doubles: a few times per
// upload).
//
// Invariant: an archive never holds more bytes than its entry is charged.
// A chunk writes only below the upload's charge, under the upload's shared
// lock, from its check to its record; Commit takes the exclusive lock, so no
// chunk writes into a committed archive, and cuts the archive to the
// committed size (bytes of a chunk cut short, or refused, go with it).
//
// Crash windows: dying after WriteAt leaves bytes without a record (the
// commit then refuses the gap, the client retries or the TTL removes them);
// no window leaves bytes past the upload's charge.
func (c *Cache) Upload(ctx context.Context, s Scope, id, start, end int64, body io.Reader) error {
	if err := s.check(); err != nil {
		return err
	}
	if start < 0 || end < start {
		return fmt.Errorf("%w: bad range %d-%d", ErrInvalid, start, end)
	}
	if end >= c.Limits.MaxBytes {
		return fmt.Errorf("%w: chunk ends at %d, past the limit of %d bytes", ErrTooLarge, end, c.Limits.MaxBytes)
	}
	release, err := c.lockUpload(ctx, s, id, false)
	if err != nil {
		return err
	}
	defer release()
	var grant int64
	err = c.Storage.Update(ctx, s.key(), func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		if e.Declared > 0 && end >= e.Declared {
			return fmt.Errorf("%w: chunk ends at %d, past the declared %d bytes", ErrTooLarge, end, e.Declared)
		}
		if end >= e.charge() {
			grant = min(c.Limits.MaxBytes, max(end+1, 2*e.charge()))
		}
		return nil // unchanged: not saved
	})
	if err != nil {
		return err
	}
	if grant > 0 {
		if err := c.grow(ctx, s, id, grant); err != nil {
			return err
		}
	}
	n := end - start + 1
	if err := c.Storage.WriteAt(ctx, s.key(), id, start, body, n); err != nil {
		return fmt.Errorf("cache entry %d: %w", id, err)
	}
	if err := c.Storage.AddPart(ctx, s.key(), id, start, n, maxParts); err != nil {
		return fmt.Errorf("cache entry %d: %w", id, err)
	}
	return nil
}

// grow raises upload id's grant to grant bytes, as Reserve admits a new
// upload.
func (c *Cache) grow(ctx context.Context, s Scope, id, grant int64) error {
	unlock, err := c.Storage.Lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	var old int64
	err = c.admit(ctx, s.key(), func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		old = e.Held
		e.Held = max(e.Held, grant)
		return nil
	})
	if err != nil {
		return err
	}
	if err := c.makeRoom(ctx); err != nil {
		c.undo(ctx, s.key(), id, func(ix *Index) { ix.find(id).Held = old })
		return err
	}
	return nil
}

// lockUpload takes upload id's lock; an upload whose archive is gone is
// ErrNotFound.
func (c *Cache) lockUpload(ctx context.Context, s Scope, id int64, exclusive bool) (func(), error) {
	release, err := c.Storage.LockUpload(ctx, s.key(), id, exclusive)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	case err != nil:
		return nil, fmt.Errorf("cache entry %d: %w", id, err)
	}
	return release, nil
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
// It waits for the chunks being written, and cuts the archive to size
// before the entry is saved committed. Then the repository's least
// recently used entries are evicted until it is within its limits. Its
// charge never grows: size is at most what the upload held.
func (c *Cache) Commit(ctx context.Context, s Scope, id, size int64) error {
	if err := s.check(); err != nil {
		return err
	}
	release, err := c.lockUpload(ctx, s, id, true)
	if err != nil {
		return err
	}
	defer release()
	var evicted []int64
	err = c.Storage.Update(ctx, s.key(), func(ix *Index) error {
		e, err := writable(ix, s, id)
		if err != nil {
			return err
		}
		if size <= 0 || size > c.Limits.MaxBytes || size > e.charge() || (e.Declared > 0 && size != e.Declared) {
			return fmt.Errorf("%w: size %d (declared %d)", ErrInvalid, size, e.Declared)
		}
		parts, err := c.Storage.Parts(ctx, s.key(), id)
		if err != nil {
			return fmt.Errorf("cache entry %d: %w", id, err)
		}
		if err := covers(parts, size); err != nil {
			return err
		}
		if err := c.Storage.Truncate(ctx, s.key(), id, size); err != nil {
			return fmt.Errorf("cache entry %d: %w", id, err)
		}
		now := c.now()
		e.Committed, e.Size, e.Held, e.Created, e.Used = true, size, 0, now, now
		evicted = c.sweep(ix, id)
		return nil
	})
	if err != nil {
		return err
	}
	c.remove(ctx, s.key(), evicted)
	// The entry's chunk records, and whatever a crash left behind; a
	// failure leaves them to the next commit.
	_ = c.Storage.Prune(ctx, s.key())
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
	err := c.Storage.Update(ctx, s.key(), func(ix *Index) error {
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
	f, err := c.Storage.Open(ctx, s.key(), id)
	if err != nil {
		return nil, Entry{}, fmt.Errorf("cache entry %d: %w", id, err)
	}
	return f, got, nil
}

func (c *Cache) expired(e Entry) bool {
	return c.Limits.MaxAge > 0 && c.now().Sub(e.Used) > c.Limits.MaxAge
}

// abandoned tells an upload reserved more than the TTL ago.
func (c *Cache) abandoned(e Entry) bool {
	return !e.Committed && c.now().Sub(e.Created) > c.ttl()
}

// sweep drops abandoned uploads and expired entries, then the least
// recently used committed entries but keep (the entry just committed) until
// the repository is within its limits: its charge (committed sizes plus
// what uploads under way hold) within MaxBytes, its committed entries
// within MaxEntries. Uploads under way are never evicted (admit refuses
// what they would hold past the limit). It returns the IDs whose files are
// to be removed.
func (c *Cache) sweep(ix *Index, keep int64) []int64 {
	var gone []int64
	kept := ix.Entries[:0]
	for _, e := range ix.Entries {
		if c.abandoned(e) || (e.Committed && c.expired(e)) {
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
			bytes += e.charge()
			if !e.Committed {
				continue
			}
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

// makeRoom, under the storage-wide lock, sweeps every repository whose
// usage shows an abandoned upload or an expired entry (so that any
// repository's reservation removes what another abandoned), then evicts
// the least recently used committed entries across repositories until the
// total is within MaxTotalBytes. ErrTooLarge: uploads under way alone pass
// it.
func (c *Cache) makeRoom(ctx context.Context) error {
	usages, err := c.Storage.Usage(ctx)
	if err != nil {
		return fmt.Errorf("cache usage: %w", err)
	}
	now := c.now()
	for i, u := range usages {
		due := (!u.OldestUpload.IsZero() && now.Sub(u.OldestUpload) > c.ttl()) ||
			(c.Limits.MaxAge > 0 && !u.LRU.IsZero() && now.Sub(u.LRU) > c.Limits.MaxAge)
		if u.Repository == "" || !due {
			continue
		}
		if usages[i], err = c.evict(ctx, u.Repository, func(ix *Index) []int64 { return c.sweep(ix, 0) }); err != nil {
			return err
		}
		_ = c.Storage.Prune(ctx, u.Repository)
	}
	if c.Limits.MaxTotalBytes <= 0 {
		return nil
	}
	for {
		var total int64
		victim := -1
		for i, u := range usages {
			total += u.Bytes
			if u.Repository != "" && !u.LRU.IsZero() && (victim < 0 || u.LRU.Before(usages[victim].LRU) ||
				(u.LRU.Equal(usages[victim].LRU) && u.Repository < usages[victim].Repository)) {
				victim = i
			}
		}
		if total <= c.Limits.MaxTotalBytes {
			return nil
		}
		if victim < 0 {
			return fmt.Errorf("%w: uploads under way hold %d bytes across repositories, the limit is %d", ErrTooLarge, total, c.Limits.MaxTotalBytes)
		}
		// The victim's entries go up to the next repository's least
		// recently used one: one index update per repository in turn.
		var next time.Time
		for i, u := range usages {
			if i != victim && u.Repository != "" && !u.LRU.IsZero() && (next.IsZero() || u.LRU.Before(next)) {
				next = u.LRU
			}
		}
		excess := total - c.Limits.MaxTotalBytes
		if usages[victim], err = c.evict(ctx, usages[victim].Repository, func(ix *Index) []int64 { return evictLRU(ix, excess, next) }); err != nil {
			return err
		}
	}
}

// evict runs f on repo's index, removes the files of the entries it
// returns, and returns the repository's usage after.
func (c *Cache) evict(ctx context.Context, repo string, f func(*Index) []int64) (Usage, error) {
	var gone []int64
	var u Usage
	err := c.Storage.Update(ctx, repo, func(ix *Index) error {
		gone = f(ix)
		u = ix.Usage()
		return nil
	})
	if err != nil {
		return Usage{}, err
	}
	u.Repository = repo
	c.remove(ctx, repo, gone)
	return u, nil
}

// evictLRU drops the least recently used committed entries, at least one,
// until excess bytes are freed or the next one was used after until (zero:
// no bound), and returns their IDs.
func evictLRU(ix *Index, excess int64, until time.Time) []int64 {
	var lru []Entry
	for _, e := range ix.Entries {
		if e.Committed {
			lru = append(lru, e)
		}
	}
	slices.SortFunc(lru, func(a, b Entry) int { return cmp.Or(a.Used.Compare(b.Used), cmp.Compare(a.ID, b.ID)) })
	var gone []int64
	var freed int64
	for _, e := range lru {
		if len(gone) > 0 && (freed >= excess || (!until.IsZero() && e.Used.After(until))) {
			break
		}
		gone = append(gone, e.ID)
		freed += e.Size
	}
	ix.Entries = slices.DeleteFunc(ix.Entries, func(e Entry) bool { return slices.Contains(gone, e.ID) })
	return gone
}

// remove deletes the files of entries no longer in the index; a failure
// leaves orphans, which no index names and Prune deletes.
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
