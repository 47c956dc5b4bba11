package actionscache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Caps of what Dir reads back: an index (thousands of entries fit well
// inside), a usage file, an upload's chunk records (maxParts fit).
const (
	maxIndexBytes = 64 << 20
	maxUsageBytes = 64 << 10
	maxPartsBytes = 1 << 20
)

// partRecord is the size of one chunk record: offset and length, big-endian.
const partRecord = 16

// Dir is a Storage in a directory: one subdirectory per repository, named by
// the SHA-256 of the repository's name (nothing a job sends becomes a path),
// holding index.json, its lock file index.lock, usage.json (the index summed
// up, with the repository's name), one <id>.archive per entry (created at
// its reservation, and the lock file of its upload) and one <id>.parts per
// upload under way (its chunk records, appended). Dir's own
// cache.lock is the storage-wide lock. Several processes may share it
// (gateway replicas on one ReadWriteMany volume): each lock is an exclusive
// flock(2), and index.json and usage.json are replaced by rename.
//
// Crash windows of Update (the process dies; nothing is fsynced, so a power
// loss may lose more): usage.json is written before index.json when the
// charge grows and after it otherwise, so that a crash between the two
// leaves usage.json counting more than the index, never less; the next
// Update of the repository rewrites it.
type Dir struct {
	Path string

	mu     sync.Mutex
	repos  map[string]*sync.Mutex
	global sync.Mutex
}

func (d *Dir) repoDir(repo string) string {
	sum := sha256.Sum256([]byte(repo))
	return filepath.Join(d.Path, hex.EncodeToString(sum[:16]))
}

func (d *Dir) archive(repo string, id int64) string {
	return filepath.Join(d.repoDir(repo), strconv.FormatInt(id, 10)+".archive")
}

func (d *Dir) parts(repo string, id int64) string {
	return filepath.Join(d.repoDir(repo), strconv.FormatInt(id, 10)+".parts")
}

// local serializes the goroutines of this process on repo (flock locks
// belong to open files, and each Update opens its own).
func (d *Dir) local(repo string) *sync.Mutex {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.repos == nil {
		d.repos = map[string]*sync.Mutex{}
	}
	m, ok := d.repos[repo]
	if !ok {
		m = &sync.Mutex{}
		d.repos[repo] = m
	}
	return m
}

// locked runs f on repo's directory under the repository's lock.
func (d *Dir) locked(repo string, f func(dir string) error) error {
	dir := d.repoDir(repo)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cache of %s: %w", repo, err)
	}
	m := d.local(repo)
	m.Lock()
	defer m.Unlock()
	unlock, err := lockFile(filepath.Join(dir, "index.lock"))
	if err != nil {
		return fmt.Errorf("cache of %s: lock: %w", repo, err)
	}
	defer unlock()
	return f(dir)
}

// readIndex reads dir's index and its bytes (nil: none yet).
func readIndex(dir string) (Index, []byte, error) {
	var ix Index
	data, err := readCapped(filepath.Join(dir, "index.json"), maxIndexBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ix, nil, nil
	case err != nil:
		return ix, nil, err
	}
	if err := json.Unmarshal(data, &ix); err != nil {
		return ix, nil, fmt.Errorf("index.json is corrupt: %w", err)
	}
	return ix, data, nil
}

// Update implements Storage.
func (d *Dir) Update(ctx context.Context, repo string, f func(*Index) error) error {
	return d.locked(repo, func(dir string) error {
		ix, old, err := readIndex(dir)
		if err != nil {
			return fmt.Errorf("cache of %s: %w", repo, err)
		}
		if err := f(&ix); err != nil {
			return err
		}
		data, err := json.Marshal(ix)
		if err != nil {
			return err
		}
		u := ix.Usage()
		u.Repository = repo
		usage, err := json.Marshal(u)
		if err != nil {
			return err
		}
		var stored Usage
		storedData, err := readCapped(filepath.Join(dir, "usage.json"), maxUsageBytes)
		if err != nil || json.Unmarshal(storedData, &stored) != nil {
			stored = Usage{Bytes: -1} // missing or unreadable: written before the index
		}
		usageChanged := !bytes.Equal(storedData, usage)
		if usageChanged && u.Bytes > stored.Bytes {
			if err := replaceFile(filepath.Join(dir, "usage.json"), usage); err != nil {
				return fmt.Errorf("cache of %s: %w", repo, err)
			}
			usageChanged = false
		}
		if !bytes.Equal(data, old) {
			if err := replaceFile(filepath.Join(dir, "index.json"), data); err != nil {
				return fmt.Errorf("cache of %s: %w", repo, err)
			}
		}
		if usageChanged {
			if err := replaceFile(filepath.Join(dir, "usage.json"), usage); err != nil {
				return fmt.Errorf("cache of %s: %w", repo, err)
			}
		}
		return nil
	})
}

// replaceFile replaces path with data by rename: a reader sees the old
// file or the new one.
func replaceFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(data)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, err
}

// Create implements Storage.
func (d *Dir) Create(ctx context.Context, repo string, id int64) error {
	if err := os.MkdirAll(d.repoDir(repo), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(d.archive(repo, id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// LockUpload implements Storage: an flock(2) of the upload's archive, so
// that it holds across the processes sharing the directory.
func (d *Dir) LockUpload(ctx context.Context, repo string, id int64, exclusive bool) (func(), error) {
	return lockExisting(d.archive(repo, id), exclusive)
}

// Truncate implements Storage.
func (d *Dir) Truncate(ctx context.Context, repo string, id, size int64) error {
	return os.Truncate(d.archive(repo, id), size)
}

// WriteAt implements Storage.
func (d *Dir) WriteAt(ctx context.Context, repo string, id, off int64, r io.Reader, n int64) error {
	f, err := os.OpenFile(d.archive(repo, id), os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	got, err := io.Copy(io.NewOffsetWriter(f, off), io.LimitReader(r, n))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && got != n {
		err = fmt.Errorf("%w: chunk of %d bytes ended after %d", ErrInvalid, n, got)
	}
	return err
}

// AddPart implements Storage. A record torn by a crash is overwritten by
// the next one (records start at multiples of partRecord) and ignored by
// Parts.
func (d *Dir) AddPart(ctx context.Context, repo string, id, off, n int64, max int) error {
	return d.locked(repo, func(dir string) error {
		ix, _, err := readIndex(dir)
		if err != nil {
			return fmt.Errorf("cache of %s: %w", repo, err)
		}
		switch e := ix.find(id); {
		case e == nil: // removed while its chunk was written
			_ = os.Remove(d.archive(repo, id))
			_ = os.Remove(d.parts(repo, id))
			return fmt.Errorf("%w: %d", ErrNotFound, id)
		case e.Committed:
			return fmt.Errorf("%w: entry %d is committed", ErrExists, id)
		}
		f, err := os.OpenFile(d.parts(repo, id), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		at := st.Size() - st.Size()%partRecord
		if at/partRecord >= int64(max) {
			return fmt.Errorf("%w: more than %d chunks", ErrInvalid, max)
		}
		var rec [partRecord]byte
		binary.BigEndian.PutUint64(rec[:8], uint64(off))
		binary.BigEndian.PutUint64(rec[8:], uint64(n))
		if _, err := f.WriteAt(rec[:], at); err != nil {
			return err
		}
		return f.Close()
	})
}

// Parts implements Storage.
func (d *Dir) Parts(ctx context.Context, repo string, id int64) (map[int64]int64, error) {
	data, err := readCapped(d.parts(repo, id), maxPartsBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	parts := map[int64]int64{}
	for ; len(data) >= partRecord; data = data[partRecord:] {
		off, n := int64(binary.BigEndian.Uint64(data[:8])), int64(binary.BigEndian.Uint64(data[8:16]))
		if off < 0 || n <= 0 {
			return nil, fmt.Errorf("%s: a corrupt chunk record", d.parts(repo, id))
		}
		parts[off] = max(parts[off], n)
	}
	return parts, nil
}

// Open implements Storage.
func (d *Dir) Open(ctx context.Context, repo string, id int64) (io.ReadSeekCloser, error) {
	return os.Open(d.archive(repo, id))
}

// Remove implements Storage.
func (d *Dir) Remove(ctx context.Context, repo string, id int64) error {
	var errs []error
	for _, path := range []string{d.archive(repo, id), d.parts(repo, id)} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Prune implements Storage.
func (d *Dir) Prune(ctx context.Context, repo string) error {
	return d.locked(repo, func(dir string) error {
		ix, _, err := readIndex(dir)
		if err != nil {
			return fmt.Errorf("cache of %s: %w", repo, err)
		}
		files, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("cache of %s: %w", repo, err)
		}
		var errs []error
		for _, f := range files {
			name, ext, _ := strings.Cut(f.Name(), ".")
			id, err := strconv.ParseInt(name, 10, 64)
			if err != nil || (ext != "archive" && ext != "parts") {
				continue
			}
			e := ix.find(id)
			if e == nil || (ext == "parts" && e.Committed) {
				if err := os.Remove(filepath.Join(dir, f.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		return errors.Join(errs...)
	})
}

// Lock implements Storage.
func (d *Dir) Lock(ctx context.Context) (func(), error) {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return nil, fmt.Errorf("cache %s: %w", d.Path, err)
	}
	d.global.Lock()
	unlock, err := lockFile(filepath.Join(d.Path, "cache.lock"))
	if err != nil {
		d.global.Unlock()
		return nil, fmt.Errorf("cache %s: lock: %w", d.Path, err)
	}
	return func() {
		unlock()
		d.global.Unlock()
	}, nil
}

// Usage implements Storage: each repository's usage.json, or where there is
// none yet (an index saved before usage.json was kept), what its index sums
// up to, unnamed.
func (d *Dir) Usage(ctx context.Context) ([]Usage, error) {
	dirs, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", d.Path, err)
	}
	var out []Usage
	for _, de := range dirs {
		if !de.IsDir() {
			continue
		}
		dir := filepath.Join(d.Path, de.Name())
		var u Usage
		data, err := readCapped(filepath.Join(dir, "usage.json"), maxUsageBytes)
		if err == nil && json.Unmarshal(data, &u) == nil {
			out = append(out, u)
			continue
		}
		ix, data, err := readIndex(dir)
		if err != nil {
			return nil, fmt.Errorf("cache %s: %w", dir, err)
		}
		if data != nil {
			out = append(out, ix.Usage())
		}
	}
	return out, nil
}
