package actionscache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// maxIndexBytes bounds an index read back: maxReservations uploads of
// maxParts chunks and thousands of entries fit well inside.
const maxIndexBytes = 64 << 20

// Dir is a Storage in a directory: one subdirectory per repository, named by
// the SHA-256 of the repository's name (nothing a job sends becomes a path),
// holding index.json, its lock file and one file per archive. Several
// processes may share it (gateway replicas on one ReadWriteMany volume): an
// index is updated under an exclusive flock(2) of its lock file and replaced
// by rename.
type Dir struct {
	Path string

	mu    sync.Mutex
	repos map[string]*sync.Mutex
}

func (d *Dir) repoDir(repo string) string {
	sum := sha256.Sum256([]byte(repo))
	return filepath.Join(d.Path, hex.EncodeToString(sum[:16]))
}

func (d *Dir) archive(repo string, id int64) string {
	return filepath.Join(d.repoDir(repo), strconv.FormatInt(id, 10)+".archive")
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

// Update implements Storage.
func (d *Dir) Update(ctx context.Context, repo string, f func(*Index) error) error {
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
	path := filepath.Join(dir, "index.json")
	var ix Index
	switch data, err := readCapped(path, maxIndexBytes); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("cache of %s: %w", repo, err)
	default:
		if err := json.Unmarshal(data, &ix); err != nil {
			return fmt.Errorf("cache of %s: index.json is corrupt: %w", repo, err)
		}
	}
	if err := f(&ix); err != nil {
		return err
	}
	data, err := json.Marshal(ix)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("cache of %s: %w", repo, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cache of %s: %w", repo, err)
	}
	return nil
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

// WriteAt implements Storage.
func (d *Dir) WriteAt(ctx context.Context, repo string, id, off int64, r io.Reader, n int64) error {
	if err := os.MkdirAll(d.repoDir(repo), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(d.archive(repo, id), os.O_WRONLY|os.O_CREATE, 0o600)
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

// Open implements Storage.
func (d *Dir) Open(ctx context.Context, repo string, id int64) (io.ReadSeekCloser, error) {
	return os.Open(d.archive(repo, id))
}

// Remove implements Storage.
func (d *Dir) Remove(ctx context.Context, repo string, id int64) error {
	err := os.Remove(d.archive(repo, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
