package clusterenv

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestTarDir: an OCI layout's folder becomes a tar archive with names
// relative to it (what `ctr images import` reads), folders first.
func TestTarDir(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"oci-layout": "{}", "index.json": "{}", "blobs/sha256/ab": "x"} {
		p := filepath.Join(dir, "layout", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "layout.tar")
	if err := tarDir(filepath.Join(dir, "layout"), out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	want := []string{"blobs/", "blobs/sha256/", "blobs/sha256/ab", "index.json", "oci-layout"}
	if !slices.Equal(names, want) {
		t.Fatalf("archive holds %v, want %v", names, want)
	}
}

// TestWriteKubeconfig: the node's kubeconfig points at the proxy address,
// with the plane's CA and client certificate.
func TestWriteKubeconfig(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1234"}
	cfg.CAData, cfg.CertData, cfg.KeyData = []byte("ca"), []byte("cert"), []byte("key")
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(path, cfg, "https://127.0.0.1:6443"); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cl, u := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster], kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
	if cl.Server != "https://127.0.0.1:6443" || string(cl.CertificateAuthorityData) != "ca" ||
		string(u.ClientCertificateData) != "cert" || string(u.ClientKeyData) != "key" {
		t.Fatalf("kubeconfig %+v %+v", cl, u)
	}
}
