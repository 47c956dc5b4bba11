// Package functiontest checks a function's command line against the
// conventions every function follows (package function): -h, --help and
// --version exit 0 without any configuration; an unknown command or flag
// exits 2 and says so before any configuration is read; bad configuration
// exits 2 and names what is wrong.
package functiontest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
)

// Exec is a function's command line run in process: its arguments (without
// the program name) and its standard error; it returns the exit code.
type Exec func(ctx context.Context, args []string, stderr io.Writer) int

// Case is one command line and what it must do.
type Case struct {
	Name string
	// Env is set for the case (t.Setenv); nothing else of GDR_* is.
	Env  map[string]string
	Args []string
	Code int
	// Want and NotWant are substrings stderr must and must not hold.
	Want, NotWant []string
}

// Conventions are the cases every function answers the same way. A function
// without subcommands says so (takesNone): "<name> takes none".
func Conventions(name string, takesNone bool) []Case {
	unknown := fmt.Sprintf("%s: unknown command %q", name, "nope")
	if takesNone {
		unknown += fmt.Sprintf(" (%s takes none)", name)
	}
	return []Case{
		{Name: "help", Args: []string{"-h"}, Code: 0, Want: []string{"usage: " + name}},
		{Name: "long help", Args: []string{"--help"}, Code: 0, Want: []string{"usage: " + name}},
		{Name: "version", Args: []string{"--version"}, Code: 0},
		{Name: "unknown command", Args: []string{"nope"}, Code: 2, Want: []string{unknown, "usage: " + name}, NotWant: []string{"configuration"}},
		{Name: "unknown flag", Args: []string{"--nope"}, Code: 2, Want: []string{"flag provided but not defined: -nope"}},
	}
}

// Run runs every case through exec as a subtest of t.
func Run(t *testing.T, name string, exec Exec, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			for k, v := range tc.Env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			if code := exec(context.Background(), tc.Args, &stderr); code != tc.Code {
				t.Fatalf("%s %q exited %d, want %d; stderr:\n%s", name, tc.Args, code, tc.Code, stderr.String())
			}
			for _, w := range tc.Want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			for _, w := range tc.NotWant {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr shows %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// BareNamesIgnored checks that every variable of the configuration newCfg
// returns (a new pointer to an envconfig struct each call) is named under
// GDR_ and is read under that name only: its bare name (MODE for GDR_MODE,
// which envconfig would fall back to under a prefix) set to "x", a value
// that every type but a string refuses, changes neither the configuration
// read nor the error reading it.
func BareNamesIgnored(t *testing.T, newCfg func() any) {
	t.Helper()
	vars, err := envdoc.Vars(newCfg())
	if err != nil {
		t.Fatal(err)
	}
	if len(vars) == 0 {
		t.Fatal("the configuration has no variables")
	}
	want := newCfg()
	wantErr := fmt.Sprint(envdoc.Process(want))
	for _, v := range vars {
		bare, ok := strings.CutPrefix(v.Name, "GDR_")
		if !ok {
			t.Errorf("variable %s is not under GDR_", v.Name)
			continue
		}
		t.Run(bare, func(t *testing.T) {
			t.Setenv(bare, "x")
			got := newCfg()
			if gotErr := fmt.Sprint(envdoc.Process(got)); gotErr != wantErr {
				t.Errorf("with %s=x set, reading the configuration fails with %s, want %s", bare, gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("with %s=x set, the configuration is %+v, want %+v", bare, got, want)
			}
		})
	}
}
