package kedaenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestWriteServingCertLoadsAsKEDAsGRPCServerDoes(t *testing.T) {
	dir := t.TempDir()
	if err := writeServingCert(dir); err != nil {
		t.Fatal(err)
	}
	// pkg/metricsservice/utils.LoadGrpcTLSCredentials: a key pair and a CA pool.
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatalf("key pair: %v", err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("ca.crt holds no certificate")
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"}); err != nil {
		t.Fatalf("tls.crt does not verify against ca.crt for 127.0.0.1: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "tls.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("tls.key: %v, mode %v, want 0600", err, fi.Mode())
	}
}

func TestWriteKubeconfigRoundTrips(t *testing.T) {
	tests := []struct {
		name string
		cfg  *rest.Config
		err  string
	}{
		{"client certificate", &rest.Config{Host: "https://127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("cert"), KeyData: []byte("key")}}, ""},
		{"token", &rest.Config{Host: "https://127.0.0.1:6443", BearerToken: "t0ken", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca")}}, ""},
		{"missing CA file", &rest.Config{Host: "https://127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAFile: "/nonexistent/ca.crt"}}, "no such file"},
		{"exec provider", &rest.Config{Host: "https://127.0.0.1:6443", ExecProvider: &clientcmdapi.ExecConfig{Command: "x"}}, "exec or auth provider"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			err := writeKubeconfig(tc.cfg, path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("kubeconfig mode: %v, %v", fi, err)
			}
			got, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				t.Fatal(err)
			}
			if got.Host != tc.cfg.Host || string(got.CAData) != string(tc.cfg.CAData) || string(got.CertData) != string(tc.cfg.CertData) ||
				string(got.KeyData) != string(tc.cfg.KeyData) || got.BearerToken != tc.cfg.BearerToken {
				t.Fatalf("read back %+v, want %+v", got, tc.cfg)
			}
		})
	}
}

func TestInstallCRDsRefusesWhatIsNotACRD(t *testing.T) {
	ctx := context.Background()
	cfg := &rest.Config{Host: "https://127.0.0.1:1"} // never reached: the files are refused first
	empty := t.TempDir()
	if err := InstallCRDs(ctx, cfg, empty); err == nil || !strings.Contains(err.Error(), "no CRDs") {
		t.Fatalf("empty folder: err = %v", err)
	}
	notCRD := t.TempDir()
	if err := os.WriteFile(filepath.Join(notCRD, "cm.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := InstallCRDs(ctx, cfg, notCRD); err == nil || !strings.Contains(err.Error(), "not a CustomResourceDefinition") {
		t.Fatalf("a ConfigMap: err = %v", err)
	}
}
