//go:build e2e

package main

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/giteaenv"
)

// blobSum is what the save job prints of its random file.
var blobSum = regexp.MustCompile(`saved blob=([0-9a-f]{64})`)

// restoreJob is a job that restores deps with the real actions/cache@v4,
// prints what it got, and fails on a miss when mustHit.
func restoreJob(name string, mustHit bool) string {
	return fmt.Sprintf(`  %s:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/cache@v4
        id: cache
        with:
          path: deps
          key: deps-v1
          fail-on-cache-miss: %t
      - run: echo "hit=${{ steps.cache.outputs.cache-hit }} content=$(cat deps/out.txt 2>/dev/null) blob=$(sha256sum deps/blob 2>/dev/null | cut -c1-64)"
`, name, mustHit)
}

// pushFile creates or updates path on branch of repo, which fires a push
// event on that branch.
func pushFile(t *testing.T, g *giteaenv.Server, repo, branch, path, content string) {
	t.Helper()
	p := "/repos/" + repo + "/contents/" + path
	var cur struct {
		SHA string `json:"sha"`
	}
	if g.Do(t, http.MethodGet, p+"?ref="+branch, nil, &cur) != http.StatusOK {
		cur.SHA = ""
	}
	method := http.MethodPost
	if cur.SHA != "" {
		method = http.MethodPut
	}
	if code := g.Do(t, method, p, map[string]string{"content": base64.StdEncoding.EncodeToString([]byte(content)),
		"message": "update " + path, "branch": branch, "sha": cur.SHA}, nil); code/100 != 2 {
		t.Fatalf("push %s to %s: %d", path, branch, code)
	}
}

func (s setup) jobLog(t *testing.T, repo string, j giteaenv.Job) string {
	t.Helper()
	return s.gitea.JobLogs(t, repo, j.ID)
}

// actions/cache@v4, unmodified, hosted in the test's Gitea: a job saves,
// a dependent job restores it in another executor; another repository with
// the same key gets no hit; a feature branch restores the default branch's
// entry.
func TestE2ECacheAcrossExecutorsScopedPerRepository(t *testing.T) {
	s := newSetup(t)
	s.gitea.HostAction(t, giteaenv.VendoredAction("cache-v4"), "actions", "cache", "v4")
	var out syncBuffer
	runners := s.keepRunnerLogs(t)
	defer func() {
		if t.Failed() {
			t.Logf("runner logs:\n%s", runners)
		}
	}()
	startLocal(t, &out, s.args(true)...)
	content := fmt.Sprintf("built-%d", time.Now().UnixNano())
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/cache.yml", `name: cache
on:
  push:
    branches: [main]
jobs:
  save:
    runs-on: ubuntu-latest
    steps:
      - run: mkdir -p deps && echo `+content+` > deps/out.txt && head -c 300000 /dev/urandom > deps/blob && echo "saved blob=$(sha256sum deps/blob | cut -c1-64)"
      - uses: actions/cache@v4
        with:
          path: deps
          key: deps-v1
  restore:
    needs: save
`+strings.SplitN(restoreJob("restore", true), "\n", 2)[1])

	save := s.waitJob(t, "save", completed, 3*time.Minute, &out)
	saveLog := s.jobLog(t, s.repo, save)
	if save.Conclusion != "success" || !strings.Contains(saveLog, "Cache saved with key: deps-v1") {
		t.Fatalf("save = %+v, log:\n%s", save, saveLog)
	}
	blob := blobSum.FindStringSubmatch(saveLog)
	if blob == nil {
		t.Fatalf("save printed no blob sum:\n%s", saveLog)
	}
	restore := s.waitJob(t, "restore", completed, 3*time.Minute, &out)
	restoreLog := s.jobLog(t, s.repo, restore)
	if restore.Conclusion != "success" || !strings.Contains(restoreLog, "hit=true content="+content+" blob="+blob[1]) {
		t.Fatalf("restore = %+v (want the blob %s), log:\n%s", restore, blob[1], restoreLog)
	}

	// Another repository, the same key and paths: no hit.
	other := s.gitea.CreateRepo(t, "other")
	s.gitea.PushWorkflow(t, other, ".gitea/workflows/cache.yml", "name: cache\non: [push]\njobs:\n"+restoreJob("restore-other", false))
	j := s.gitea.WaitJob(t, other, func(j giteaenv.Job) bool { return j.Name == "restore-other" && completed(j) }, 3*time.Minute)
	log := s.jobLog(t, other, j)
	if j.Conclusion != "success" || !strings.Contains(log, "Cache not found for input keys: deps-v1") ||
		strings.Contains(log, content) || strings.Contains(log, "Failed to restore") {
		t.Fatalf("another repository's restore = %+v, log:\n%s", j, log)
	}

	// A feature branch restores the default branch's entry.
	if code := s.gitea.Do(t, http.MethodPost, "/repos/"+s.repo+"/branches",
		map[string]string{"new_branch_name": "feature", "old_branch_name": "main"}, nil); code != http.StatusCreated {
		t.Fatalf("create branch: %d", code)
	}
	pushFile(t, s.gitea, s.repo, "feature", ".gitea/workflows/feature.yml",
		"name: feature\non:\n  push:\n    branches: [feature]\njobs:\n"+restoreJob("restore-feature", true))
	feature := s.waitJob(t, "restore-feature", completed, 3*time.Minute, &out)
	featureLog := s.jobLog(t, s.repo, feature)
	if feature.Conclusion != "success" || !strings.Contains(featureLog, "hit=true content="+content+" blob="+blob[1]) {
		t.Fatalf("the feature branch's restore = %+v, log:\n%s", feature, featureLog)
	}
}

// The v4 artifact protocol of Gitea itself, with the variables the runner
// sets as act_runner does (ACTIONS_RESULTS_URL, ACTIONS_RUNTIME_TOKEN):
// one job uploads, a dependent job downloads the same bytes. The steps
// speak the protocol as @actions/artifact does (twirp JSON, the backend IDs
// from the runtime token's scp claim, the signed upload and download URLs)
// with curl and node: upstream upload-artifact@v4 refuses any server but
// github.com (GHESNotSupportedError, go-gitea/gitea#31256), whatever a
// runner sets.
func TestE2EArtifactsRoundTripBetweenJobs(t *testing.T) {
	s := newSetup(t)
	var out syncBuffer
	runners := s.keepRunnerLogs(t)
	defer func() {
		if t.Failed() {
			t.Logf("runner logs:\n%s", runners)
		}
	}()
	startLocal(t, &out, s.args(true)...)
	content := fmt.Sprintf("artifact-%d", time.Now().UnixNano())
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/artifacts.yml", `name: artifacts
on: [push]
env:
  TWIRP: twirp/github.actions.results.api.v1.ArtifactService
jobs:
  upload:
    runs-on: ubuntu-latest
    steps:
      - shell: bash
        run: |
          set -euo pipefail
          ids() { node -e 'const c=JSON.parse(Buffer.from(process.env.ACTIONS_RUNTIME_TOKEN.split(".")[1],"base64url"));const s=c.scp.split(" ").find(x=>x.startsWith("Actions.Results:")).split(":");console.log(JSON.stringify({workflow_run_backend_id:s[1],workflow_job_run_backend_id:s[2]}))'; }
          field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>console.log(JSON.parse(d)[process.argv[1]]))' "$1"; }
          call() { curl -fsS -H "Authorization: Bearer $ACTIONS_RUNTIME_TOKEN" -H 'Content-Type: application/json' -d "$2" "${ACTIONS_RESULTS_URL%/}/$TWIRP/$1"; }
          with() { node -e 'console.log(JSON.stringify({...JSON.parse(process.argv[1]),...JSON.parse(process.argv[2])}))' "$(ids)" "$1"; }
          printf '`+content+`' > payload.bin
          url=$(call CreateArtifact "$(with '{"name":"bundle","version":4}')" | field signedUploadUrl)
          curl -fsS -X PUT -H 'Content-Type: application/octet-stream' --data-binary @payload.bin "$url&comp=block"
          size=$(stat -c %s payload.bin); sum=$(sha256sum payload.bin | cut -d' ' -f1)
          call FinalizeArtifact "$(with "{\"name\":\"bundle\",\"size\":\"$size\",\"hash\":\"sha256:$sum\"}")"
          echo; echo "uploaded $size bytes"
  download:
    needs: upload
    runs-on: ubuntu-latest
    steps:
      - shell: bash
        run: |
          set -euo pipefail
          ids() { node -e 'const c=JSON.parse(Buffer.from(process.env.ACTIONS_RUNTIME_TOKEN.split(".")[1],"base64url"));const s=c.scp.split(" ").find(x=>x.startsWith("Actions.Results:")).split(":");console.log(JSON.stringify({workflow_run_backend_id:s[1],workflow_job_run_backend_id:s[2]}))'; }
          field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>console.log(JSON.parse(d)[process.argv[1]]))' "$1"; }
          call() { curl -fsS -H "Authorization: Bearer $ACTIONS_RUNTIME_TOKEN" -H 'Content-Type: application/json' -d "$2" "${ACTIONS_RESULTS_URL%/}/$TWIRP/$1"; }
          with() { node -e 'console.log(JSON.stringify({...JSON.parse(process.argv[1]),...JSON.parse(process.argv[2])}))' "$(ids)" "$1"; }
          call ListArtifacts "$(with '{"name_filter":"bundle"}')"; echo
          url=$(call GetSignedArtifactURL "$(with '{"name":"bundle"}')" | field signedUrl)
          curl -fsS -o got.bin "$url"
          echo "downloaded: $(cat got.bin)"
`)
	up := s.waitJob(t, "upload", completed, 3*time.Minute, &out)
	if upLog := s.jobLog(t, s.repo, up); up.Conclusion != "success" || !strings.Contains(upLog, fmt.Sprintf("uploaded %d bytes", len(content))) {
		t.Fatalf("upload = %+v, log:\n%s", up, upLog)
	}
	down := s.waitJob(t, "download", completed, 3*time.Minute, &out)
	if downLog := s.jobLog(t, s.repo, down); down.Conclusion != "success" || !strings.Contains(downLog, "downloaded: "+content) {
		t.Fatalf("download = %+v, log:\n%s", down, downLog)
	}
}

// With GDR_CACHE_MAX_ENTRIES=1, a repository's second save evicts its
// first: a later job restores the second and misses the first.
func TestE2ECacheEvictsUnderASmallLimit(t *testing.T) {
	t.Setenv("GDR_CACHE_MAX_ENTRIES", "1")
	s := newSetup(t)
	s.gitea.HostAction(t, giteaenv.VendoredAction("cache-v4"), "actions", "cache", "v4")
	var out syncBuffer
	runners := s.keepRunnerLogs(t)
	defer func() {
		if t.Failed() {
			t.Logf("runner logs:\n%s", runners)
		}
	}()
	startLocal(t, &out, s.args(true)...)
	s.gitea.PushWorkflow(t, s.repo, ".gitea/workflows/evict.yml", `name: evict
on: [push]
jobs:
  first:
    runs-on: ubuntu-latest
    steps:
      - run: mkdir -p one && echo one > one/f
      - uses: actions/cache@v4
        with: {path: one, key: first}
  second:
    needs: first
    runs-on: ubuntu-latest
    steps:
      - run: mkdir -p two && echo two > two/f
      - uses: actions/cache@v4
        with: {path: two, key: second}
  check:
    needs: second
    runs-on: ubuntu-latest
    steps:
      - uses: actions/cache@v4
        id: one
        with: {path: one, key: first}
      - uses: actions/cache@v4
        id: two
        with: {path: two, key: second, fail-on-cache-miss: true}
      - run: echo "first=${{ steps.one.outputs.cache-hit }} second=${{ steps.two.outputs.cache-hit }} $(cat two/f)"
`)
	for _, name := range []string{"first", "second"} {
		j := s.waitJob(t, name, completed, 3*time.Minute, &out)
		if log := s.jobLog(t, s.repo, j); j.Conclusion != "success" || !strings.Contains(log, "Cache saved with key: "+name) {
			t.Fatalf("%s = %+v, log:\n%s", name, j, log)
		}
	}
	check := s.waitJob(t, "check", completed, 3*time.Minute, &out)
	log := s.jobLog(t, s.repo, check)
	if check.Conclusion != "success" || !strings.Contains(log, "Cache not found for input keys: first") || !strings.Contains(log, "first= second=true two") {
		t.Fatalf("check = %+v, log:\n%s", check, log)
	}
}
