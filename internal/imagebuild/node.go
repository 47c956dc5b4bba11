package imagebuild

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// NodeDir is where Node.js is in an image with Packages: its bin/ holds
// node, npm and npx, as Node.js's own linux tarball lays them out.
const NodeDir = "/usr/local"

// npmTarballs are the npm registry tarballs of one architecture in the
// packages folder (scripts/debs.sh: <dir>/node/<arch>/ has the
// architecture's Node.js build, node-linux-<x64|arm64>-<version>.tgz;
// <dir>/node/all/ has npm-<version>.tgz).
type npmTarballs struct {
	node string
	npm  string
}

// nodeTarballs finds the Node.js build of arch and npm in the packages
// folder: exactly one of each.
func nodeTarballs(dir, arch string) (npmTarballs, error) {
	nodeArch := map[string]string{"amd64": "x64", "arm64": "arm64"}[arch]
	if nodeArch == "" {
		return npmTarballs{}, fmt.Errorf("packages folder %s: no Node.js build for architecture %q", dir, arch)
	}
	one := func(pattern string) (string, error) {
		files, err := filepath.Glob(filepath.Join(dir, "node", pattern))
		if err != nil {
			return "", fmt.Errorf("packages folder %s: %w", dir, err)
		}
		if len(files) != 1 {
			return "", fmt.Errorf("packages folder %s: %d files node/%s, want 1 (run scripts/debs.sh build)", dir, len(files), pattern)
		}
		return files[0], nil
	}
	node, err := one(arch + "/node-linux-" + nodeArch + "-*.tgz")
	if err != nil {
		return npmTarballs{}, err
	}
	npm, err := one("all/npm-*.tgz")
	if err != nil {
		return npmTarballs{}, err
	}
	return npmTarballs{node: node, npm: npm}, nil
}

// nodePath maps an entry of the Node.js build's tarball (package/...) to
// its place in the image, under NodeDir: bin/node, share/ (man page, docs)
// and the LICENSE (as share/doc/node/LICENSE); "" for what the image
// leaves out (the npm package's own package.json, README, CHANGELOG, and
// include/: headers node-gyp fetches for itself).
func nodePath(name string) string {
	rel, ok := strings.CutPrefix(cleanName(name), "package/")
	if !ok {
		return ""
	}
	root := strings.TrimPrefix(NodeDir, "/")
	switch {
	case rel == "bin/node":
		return root + "/bin/node"
	case rel == "LICENSE":
		return root + "/share/doc/node/LICENSE"
	case strings.HasPrefix(rel, "share/"):
		return root + "/" + rel
	}
	return ""
}

// npmPath maps an entry of npm's tarball (package/...) to its place in the
// image: NodeDir/lib/node_modules/npm/..., where Node.js's tarball has npm.
func npmPath(name string) string {
	rel, ok := strings.CutPrefix(cleanName(name), "package/")
	if !ok || rel == "" {
		return ""
	}
	return strings.TrimPrefix(NodeDir, "/") + "/lib/node_modules/npm/" + rel
}

// addNode writes Node.js and npm into the layer: node (nodePath), executable,
// npm's package (npmPath) with every file of its bin/ executable, and NodeDir's
// bin/npm and bin/npx linked to npm's CLIs. Every entry is owned by root.
func addNode(l *tarLayer, t npmTarballs) error {
	var node bool
	err := readTgz(t.node, func(h *tar.Header, r io.Reader) error {
		name := nodePath(h.Name)
		if name == "" {
			return nil
		}
		if name == strings.TrimPrefix(NodeDir, "/")+"/bin/node" {
			node = true
			h.Mode |= 0o755 // npm makes a package's bin/ executable on install
		}
		return writeRoot(l, *h, name, r)
	})
	if err != nil {
		return err
	}
	if !node {
		return fmt.Errorf("package %s: no package/bin/node", t.node)
	}
	npmDir := strings.TrimPrefix(NodeDir, "/") + "/lib/node_modules/npm/"
	clis := map[string]bool{}
	err = readTgz(t.npm, func(h *tar.Header, r io.Reader) error {
		name := npmPath(h.Name)
		if name == "" {
			return nil
		}
		if strings.HasPrefix(name, npmDir+"bin/") && h.Typeflag == tar.TypeReg {
			h.Mode |= 0o755
			clis[strings.TrimPrefix(name, npmDir)] = true
		}
		return writeRoot(l, *h, name, r)
	})
	if err != nil {
		return err
	}
	bin := strings.TrimPrefix(NodeDir, "/") + "/bin/"
	for _, cli := range []string{"npm", "npx"} {
		target := "bin/" + cli + "-cli.js"
		if !clis[target] {
			return fmt.Errorf("package %s: no package/%s", t.npm, target)
		}
		if err := l.symlink(bin+cli, "../lib/node_modules/npm/"+target); err != nil {
			return err
		}
	}
	return nil
}

// writeRoot adds the entry h as name, owned by root.
func writeRoot(l *tarLayer, h tar.Header, name string, r io.Reader) error {
	if h.Typeflag == tar.TypeLink {
		return fmt.Errorf("entry %s: hard links are not expected in an npm tarball", h.Name)
	}
	h.Name = path.Clean(name)
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	return l.write(h, r)
}

// readTgz streams the entries of the gzip-compressed tar at path to fn.
func readTgz(path string, fn func(*tar.Header, io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("package %s: %w", path, err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("package %s: %w", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("package %s: %w", path, err)
		}
		if err := fn(h, tr); err != nil {
			return fmt.Errorf("package %s: %w", path, err)
		}
	}
}
