package opensandboxenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The server gets a kubeconfig it can read in its chroot: every file the
// original names is inlined, and only root reads the copy.
func TestFlattenKubeconfig(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	for p, data := range map[string]string{ca: "CA", cert: "CERT", key: "KEY"} {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthority: ca}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	src := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "flat")
	if err := flattenKubeconfig(src, dst); err != nil {
		t.Fatal(err)
	}
	got, err := clientcmd.LoadFromFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	c, u := got.Clusters["c"], got.AuthInfos["u"]
	if c == nil || u == nil || got.CurrentContext != "c" {
		t.Fatalf("flattened kubeconfig lost its context: %+v", got)
	}
	if c.CertificateAuthority != "" || string(c.CertificateAuthorityData) != "CA" ||
		u.ClientCertificate != "" || string(u.ClientCertificateData) != "CERT" || u.ClientKey != "" || string(u.ClientKeyData) != "KEY" {
		t.Errorf("not inlined: cluster %+v, user %+v", c, u)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the copy's mode: %v %v, want 0600", fi.Mode(), err)
	}

	// A kubeconfig without a current context is refused.
	kc.CurrentContext = ""
	if err := clientcmd.WriteToFile(*kc, src); err != nil {
		t.Fatal(err)
	}
	if err := flattenKubeconfig(src, dst); err == nil || !strings.Contains(err.Error(), "no current context") {
		t.Errorf("without a current context: %v, want an error saying so", err)
	}
}
