package giteaenv

import (
	"encoding/base64"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// VendoredAction is the folder of the action vendored unmodified as
// testdata/actions/<name> beside this file (its README names upstream and
// the commit), for HostAction from any package's tests.
func VendoredAction(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "actions", name)
}

// HostAction makes the action in dir (an action.yml and what it needs)
// resolvable as `uses: <owner>/<name>@<tag>` by jobs of this Gitea (whose
// DEFAULT_ACTIONS_URL is self): it creates the public organization owner
// unless it exists, a repository name in it holding dir's files in one
// commit on "main", and tag at that commit. The files go up unmodified.
func (s *Server) HostAction(t testing.TB, dir, owner, name, tag string) {
	t.Helper()
	s.must(t, http.MethodPost, "/orgs", map[string]any{"username": owner, "visibility": "public"}, nil,
		http.StatusCreated, http.StatusUnprocessableEntity) // 422: it exists
	s.must(t, http.MethodPost, "/orgs/"+owner+"/repos", map[string]any{"name": name, "auto_init": true, "default_branch": "main"}, nil, http.StatusCreated)
	type change struct {
		Operation string `json:"operation"`
		Path      string `json:"path"`
		Content   string `json:"content"`
	}
	var files []change
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files = append(files, change{Operation: "create", Path: filepath.ToSlash(rel), Content: base64.StdEncoding.EncodeToString(data)})
		return nil
	})
	if err != nil {
		t.Fatalf("giteaenv: read action %s: %v", dir, err)
	}
	repo := owner + "/" + name
	s.must(t, http.MethodPost, "/repos/"+repo+"/contents", map[string]any{
		"branch": "main", "message": "the action, unmodified", "files": files,
	}, nil, http.StatusCreated)
	s.must(t, http.MethodPost, "/repos/"+repo+"/tags", map[string]string{"tag_name": tag, "target": "main"}, nil, http.StatusCreated)
}
