package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// tarLayer writes one image layer: a gzip-compressed tar in which every
// entry has the same modification time, numeric owners only, no setuid or
// setgid bit, and its parent directories before it; the files fileCaps names
// carry those file capabilities instead. The same calls in the same order
// give the same bytes.
type tarLayer struct {
	file  *os.File
	gz    *gzip.Writer
	tw    *tar.Writer
	mtime time.Time
	seen  map[string]bool
	// fileCaps gives files (clean names, as in the layer) the effective
	// and permitted file capabilities of its value, as the xattr
	// security.capability (Peer.FileCaps).
	fileCaps map[string][]uint
}

// xattrCapability is the PAX record of a file's security.capability
// extended attribute, which container runtimes apply when they unpack a
// layer.
const xattrCapability = "SCHILY.xattr.security.capability"

// vfsCapData is the value of security.capability (struct vfs_cap_data,
// revision 2, little-endian) giving caps as permitted and effective file
// capabilities, none inheritable.
func vfsCapData(caps []uint) []byte {
	const revision2, effective = 0x02000000, 0x000001
	words := [5]uint32{revision2 | effective} // magic, permitted[0], inheritable[0], permitted[1], inheritable[1]
	for _, c := range caps {
		words[1+2*(c/32)] |= 1 << (c % 32)
	}
	out := make([]byte, 0, 20)
	for _, w := range words {
		out = append(out, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return out
}

// newTarLayer starts a layer in the file at path.
func newTarLayer(path string, mtime time.Time) (*tarLayer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create layer %s: %w", path, err)
	}
	gz, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("layer %s: %w", path, err)
	}
	return &tarLayer{file: f, gz: gz, tw: tar.NewWriter(gz), mtime: mtime.UTC().Truncate(time.Second), seen: map[string]bool{}}, nil
}

// close finishes the layer's file.
func (l *tarLayer) close() error {
	name := l.file.Name()
	errTar := l.tw.Close()
	errGz := l.gz.Close()
	errFile := l.file.Close()
	for _, err := range []error{errTar, errGz, errFile} {
		if err != nil {
			return fmt.Errorf("finish layer %s: %w", name, err)
		}
	}
	return nil
}

// cleanName is name relative to the root, without "./", "/" or a trailing
// slash; "" for the root itself.
func cleanName(name string) string {
	name = path.Clean("/" + name)
	return strings.TrimPrefix(name, "/")
}

// write adds one entry. hdr.Name must be clean; the content (for a regular
// file) is read from r. An entry already in the layer is skipped (the first
// one wins), and so is anything but a file, directory or link.
func (l *tarLayer) write(hdr tar.Header, r io.Reader) error {
	name := cleanName(hdr.Name)
	if name == "" || l.seen[name] {
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		return nil
	}
	if err := l.parents(name); err != nil {
		return err
	}
	out := tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Linkname: hdr.Linkname,
		Mode:     hdr.Mode & 0o1777, // no setuid, no setgid
		Uid:      hdr.Uid,
		Gid:      hdr.Gid,
		ModTime:  l.mtime,
		Format:   tar.FormatPAX,
	}
	if caps, ok := l.fileCaps[name]; ok && hdr.Typeflag == tar.TypeReg {
		out.PAXRecords = map[string]string{xattrCapability: string(vfsCapData(caps))}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		out.Name += "/"
	case tar.TypeReg:
		out.Size = hdr.Size
	case tar.TypeLink:
		out.Linkname = cleanName(hdr.Linkname)
	}
	if err := l.tw.WriteHeader(&out); err != nil {
		return fmt.Errorf("layer entry %s: %w", name, err)
	}
	if hdr.Typeflag == tar.TypeReg {
		if _, err := io.CopyN(l.tw, r, hdr.Size); err != nil {
			return fmt.Errorf("layer entry %s: %w", name, err)
		}
	}
	l.seen[name] = true
	return nil
}

// parents adds the directories above name that are not in the layer yet,
// owned by root with mode 0755.
func (l *tarLayer) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." || l.seen[dir] {
		return nil
	}
	return l.dir(dir, 0o755, 0, 0)
}

// dir adds a directory.
func (l *tarLayer) dir(name string, mode int64, uid, gid int) error {
	return l.write(tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid}, nil)
}

// bytes adds a regular file owned by root.
func (l *tarLayer) bytes(name string, mode int64, data []byte) error {
	return l.write(tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, bytes.NewReader(data))
}

// symlink adds a symbolic link.
func (l *tarLayer) symlink(name, target string) error {
	return l.write(tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// copyFile adds the file at src as name, owned by root.
func (l *tarLayer) copyFile(name string, mode int64, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("layer entry %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("layer entry %s: %w", name, err)
	}
	return l.write(tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: st.Size()}, f)
}
