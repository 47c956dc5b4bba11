package main

import (
	"io"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

func TestREADMEDocumentsEveryVariable(t *testing.T) {
	if err := envdoc.CheckFile("../../README.md", function.EnvPrefix, &Config{}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfig(t *testing.T) {
	t.Setenv("GDR_LOCAL_CAPACITY", "3")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"flags", []string{"--gitea-url", "http://127.0.0.1:3000", "--labels", "a, b"}, ""},
		{"no URL", nil, "--gitea-url"},
		{"not a URL", []string{"--gitea-url", "gitea:3000"}, "not an http(s) URL"},
		{"no labels", []string{"--gitea-url", "http://x", "--labels", " , "}, "--labels is empty"},
		{"zero capacity", []string{"--gitea-url", "http://x", "--capacity", "0"}, "--capacity 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			_, err := program.Load(&c, tc.args, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.GiteaURL != "http://127.0.0.1:3000/" || c.Capacity != 3 || strings.Join(c.labels(), "|") != "a|b" || c.StateDir != "./.gdr" {
					t.Fatalf("config = %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("loadConfig() error = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}
