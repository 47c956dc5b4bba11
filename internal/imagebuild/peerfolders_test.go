package imagebuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakePeer is an image peer's script, its folder's name for every release architecture, and
// the files its built() checks per architecture.
type fakePeer struct {
	script, folder string
	files          []string // per architecture, relative to <folder>/<arch>/
}

var imagePeers = []fakePeer{
	{"scripts/peers/buildkit.sh", "buildkit-v0.34.2", []string{"bin/buildkitd", "bin/buildctl", "bin/rootlesskit"}},
	{"scripts/peers/docker.sh", "docker-26.1.5-v1", []string{"bin/docker", "bin/docker-buildx", "bin/docker-compose", "debs/docker.io_26.1.5_x.deb"}},
}

// write makes root/folder a complete folder of p holding arches (its stamp written last).
func (p fakePeer) write(t *testing.T, root, folder string, arches ...string) {
	t.Helper()
	for _, arch := range arches {
		for _, f := range p.files {
			path := filepath.Join(root, folder, arch, f)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(root, folder, ".complete"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPeerFoldersNameTheirArchitectures: an image peer's folder says what it holds. A folder
// named without an architecture holds every release architecture and serves any of them; one
// built for fewer is named <peer>-<arch> and never serves a release (`path` fails: a build
// would follow); an architecture not a release's is refused.
func TestPeerFoldersNameTheirArchitectures(t *testing.T) {
	for _, p := range imagePeers {
		for _, c := range []struct {
			name    string
			present [][]string // folders present: their architectures
			arches  string     // GDR_ARCHES
			want    string     // the folder `path` prints; "" when it must fail
			err     string
		}{
			{"one arch, built alone", [][]string{{"amd64"}}, "amd64", p.folder + "-amd64", ""},
			{"release, only one arch built", [][]string{{"amd64"}}, "amd64,arm64", "", ""},
			{"one arch from the release's folder", [][]string{{"amd64", "arm64"}}, "arm64", p.folder, ""},
			{"release", [][]string{{"amd64"}, {"amd64", "arm64"}}, "arm64 amd64", p.folder, ""},
			{"nothing built", nil, "amd64", "", ""},
			{"unknown arch", [][]string{{"amd64", "arm64"}}, "riscv64", "", "riscv64 is not one of amd64 arm64"},
		} {
			t.Run(filepath.Base(p.script)+"/"+c.name, func(t *testing.T) {
				root := t.TempDir()
				for _, arches := range c.present {
					folder := p.folder
					if len(arches) == 1 {
						folder += "-" + arches[0]
					}
					p.write(t, root, folder, arches...)
				}
				cmd := exec.Command("../../"+p.script, "path")
				cmd.Env = append(os.Environ(), "GDR_PEERS="+root, "GDR_ARCHES="+c.arches)
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				got := strings.TrimSpace(string(out))
				if c.want == "" {
					if err == nil {
						t.Fatalf("path printed %q, want a failure", got)
					}
					if !strings.Contains(stderr.String(), c.err) {
						t.Errorf("stderr %q, want %q", stderr.String(), c.err)
					}
					return
				}
				if err != nil || got != filepath.Join(root, c.want) {
					t.Errorf("path = %q, %v (%s); want %s", got, err, stderr.String(), filepath.Join(root, c.want))
				}
			})
		}
	}
}
