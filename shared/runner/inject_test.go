package runner_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// TestInstallAsThePodBackendInjectsIt runs the pod backend's init container as kubelet would,
// its volume at a temporary folder: the runner image's entrypoint (this runner) with the init
// container's args installs the runner where the runner container's command runs it from.
func TestInstallAsThePodBackendInjectsIt(t *testing.T) {
	keys, err := taskassignment.NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := pod.ParseProfile(json.RawMessage(`{"podTemplate":{"spec":{"containers":[{"name":"runner","image":"r:1"}]}}}`), keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.Spec.InitContainers) != 1 || len(tmpl.Spec.InitContainers[0].Command) != 0 {
		t.Fatalf("init containers %+v: want one running its image's entrypoint", tmpl.Spec.InitContainers)
	}
	volume := t.TempDir() // the emptyDir, mounted at pod.RunnerDir
	mapped := func(p string) string {
		if rest, ok := strings.CutPrefix(p, pod.RunnerDir+"/"); ok {
			return filepath.Join(volume, rest)
		}
		return p
	}
	var args []string
	for _, a := range tmpl.Spec.InitContainers[0].Args {
		args = append(args, mapped(a))
	}
	if code := runner.Main(nil, args); code != 0 {
		t.Fatalf("runner %q exited %d", args, code)
	}
	cmd := tmpl.Spec.Containers[0].Command
	if len(cmd) != 1 {
		t.Fatalf("runner container command %q", cmd)
	}
	installed := mapped(cmd[0])
	fi, err := os.Stat(installed)
	if err != nil {
		t.Fatalf("the runner container's command %s is not what the init container installed: %v", cmd[0], err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: mode %v, want 0755", cmd[0], fi.Mode())
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(installed)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s is not a copy of the runner (%d bytes, %v)", cmd[0], len(got), err)
	}
}

// TestPodKnowsTheWorkDir: the pod backend's docker capability finds the
// runner's work folder by the runner's own default (pod.RunnerWorkDir), so
// the two stay one value.
func TestPodKnowsTheWorkDir(t *testing.T) {
	f, ok := reflect.TypeOf(runner.Config{}).FieldByName("WorkDir")
	if !ok || f.Tag.Get("envconfig") != "GDR_WORK_DIR" {
		t.Fatalf("Config.WorkDir is not GDR_WORK_DIR: %+v", f)
	}
	if got := f.Tag.Get("default"); got != pod.RunnerWorkDir {
		t.Errorf("GDR_WORK_DIR's default is %q, pod.RunnerWorkDir %q", got, pod.RunnerWorkDir)
	}
}
