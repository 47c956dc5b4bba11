package actionscache

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// onDisk is the bytes of repo's archives in dir.
func onDisk(t *testing.T, d *Dir, repo string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(d.repoDir(repo), "*.archive"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// indexOf reads repo's index as it is saved.
func indexOf(t *testing.T, d *Dir, repo string) *Index {
	t.Helper()
	ix, _, err := readIndex(d.repoDir(repo))
	if err != nil {
		t.Fatal(err)
	}
	return &ix
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// charged is the bytes the cache counts across repositories.
func charged(t *testing.T, c *Cache) int64 {
	t.Helper()
	usages, err := c.Storage.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, u := range usages {
		n += u.Bytes
	}
	return n
}
