package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// mozillaCerts is where the ca-certificates package keeps the certificates
// its maintainer script (update-ca-certificates) would concatenate.
const mozillaCerts = "usr/share/ca-certificates/mozilla/"

// debFiles lists the .deb files of one architecture in the packages folder
// (scripts/debs.sh: <dir>/<arch>/*.deb), sorted by name.
func debFiles(dir, arch string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, arch, "*.deb"))
	if err != nil {
		return nil, fmt.Errorf("packages folder %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("packages folder %s: no .deb for %s (run scripts/debs.sh build)", dir, arch)
	}
	slices.Sort(files)
	return files, nil
}

// readDeb streams the file system tree of the .deb at path (its data
// archive, as `dpkg-deb --fsys-tarfile` gives it) to fn, one entry at a
// time. Nothing is unpacked and no maintainer script runs.
func readDeb(ctx context.Context, path string, fn func(*tar.Header, io.Reader) error) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("package %s: %w", path, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("package %s: dpkg-deb: %w", path, err)
	}
	tr := tar.NewReader(out)
	var readErr error
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		if err := fn(hdr, tr); err != nil {
			readErr = err
			break
		}
	}
	_, _ = io.Copy(io.Discard, out) // let dpkg-deb finish writing
	if err := cmd.Wait(); err != nil && readErr == nil {
		readErr = fmt.Errorf("dpkg-deb: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if readErr != nil {
		return fmt.Errorf("package %s: %w", path, readErr)
	}
	return nil
}

// addDebs writes the file system trees of the packages into the layer, in
// the order given. Directories shared by several packages appear once (the
// first package's mode wins); device files are left out.
func addDebs(ctx context.Context, l *tarLayer, debs []string) error {
	for _, deb := range debs {
		err := readDeb(ctx, deb, func(hdr *tar.Header, r io.Reader) error {
			h := *hdr
			h.Name = cleanName(h.Name)
			return l.write(h, r)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// caBundle is the CA bundle (/etc/ssl/certs/ca-certificates.crt) that the
// ca-certificates package's maintainer script would generate: every
// certificate it ships, in name order, each ending in a newline.
func caBundle(ctx context.Context, debs []string) ([]byte, error) {
	var deb string
	for _, d := range debs {
		if strings.HasPrefix(filepath.Base(d), "ca-certificates_") {
			deb = d
		}
	}
	if deb == "" {
		return nil, errors.New("CA bundle: no ca-certificates package among the .debs")
	}
	certs := map[string][]byte{}
	err := readDeb(ctx, deb, func(hdr *tar.Header, r io.Reader) error {
		name := cleanName(hdr.Name)
		if hdr.Typeflag != tar.TypeReg || !strings.HasPrefix(name, mozillaCerts) || !strings.HasSuffix(name, ".crt") {
			return nil
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		certs[name] = data
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("CA bundle: package %s has no certificate under /%s", deb, mozillaCerts)
	}
	var bundle []byte
	for _, name := range slices.Sorted(maps.Keys(certs)) {
		c := certs[name]
		bundle = append(bundle, c...)
		if !bytes.HasSuffix(c, []byte("\n")) {
			bundle = append(bundle, '\n')
		}
	}
	return bundle, nil
}
