package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The command line follows every function's conventions, run in process:
// -h, --help and --version exit 0 without configuration; an unknown command
// is said to be one (exit 2) before any configuration is read; bad
// configuration exits 2 and says so.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		wantCode int
		want     []string // substrings of stderr
		notWant  []string
	}{
		{"help", nil, []string{"-h"}, 0, []string{"usage: recover"}, nil},
		{"long help", nil, []string{"--help"}, 0, []string{"usage: recover"}, nil},
		{"version", nil, []string{"--version"}, 0, nil, nil},
		{"unknown command", nil, []string{"nope"}, 2, []string{`recover: unknown command "nope" (recover takes none)`, "usage: recover"}, []string{"configuration"}},
		{"unknown flag", nil, []string{"--nope"}, 2, []string{"flag provided but not defined: -nope"}, nil},
		{"no configuration", nil, nil, 2, []string{"recover: configuration: required variables not set"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			if code := execute(context.Background(), tc.args, &stderr); code != tc.wantCode {
				t.Fatalf("recover %q exited %d, want %d; stderr:\n%s", tc.args, code, tc.wantCode, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr shows %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}
