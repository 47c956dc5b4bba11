package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/installkeys"
)

// TestKeygen runs `dispatch keygen DIR` without any configuration: it writes every key file
// and prints their paths, and no key; a second run into the same folder fails naming the
// first file it would overwrite, and leaves the keys as they were; a wrong command line is a
// usage error.
func TestKeygen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gdr-keys")
	var stdout, stderr bytes.Buffer
	if code := executeTo(context.Background(), []string{"keygen", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, name := range installkeys.Files {
		p := filepath.Join(dir, name)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, p+"\n") {
			t.Errorf("stdout %q does not name %s", out, p)
		}
		if name != installkeys.VerifyKeys && strings.Contains(out+stderr.String(), string(data)) {
			t.Errorf("%s printed", name)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, installkeys.PayloadKey))

	stdout.Reset()
	stderr.Reset()
	code := executeTo(context.Background(), []string{"keygen", dir}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), installkeys.BootstrapKey+": already exists") {
		t.Errorf("second run: exit %d, %q; want 1 naming %s", code, stderr.String(), installkeys.BootstrapKey)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, installkeys.PayloadKey)); !bytes.Equal(before, after) {
		t.Error("the second run changed the payload key")
	}

	for _, args := range [][]string{{"keygen"}, {"keygen", "a", "b"}, {"keygen", "-print", "a"}} {
		stderr.Reset()
		if code := executeTo(context.Background(), args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage: dispatch keygen DIR") {
			t.Errorf("%q: exit %d, %q; want 2 with the usage", args, code, stderr.String())
		}
	}
}
