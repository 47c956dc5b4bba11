package function

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
)

// -o holds table or json once its flag set parses, table by default; any
// other value fails the parse with an error naming the flag and the value.
func TestOutputFlag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr string
	}{
		{"default", nil, "table", ""},
		{"table", []string{"-o", "table"}, "table", ""},
		{"json", []string{"-o", "json"}, "json", ""},
		{"json with =", []string{"-o=json"}, "json", ""},
		{"last wins", []string{"-o", "json", "-o", "table"}, "table", ""},
		{"unknown", []string{"-o", "yaml"}, "", `invalid value "yaml" for flag -o: want table or json`},
		{"case matters", []string{"-o", "JSON"}, "", `invalid value "JSON" for flag -o: want table or json`},
		{"empty", []string{"-o", ""}, "", `invalid value "" for flag -o: want table or json`},
		{"no value", []string{"-o"}, "", "flag needs an argument: -o"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("status", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			format := OutputFlag(fs)
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("parse %q: error %v, want %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil || *format != tc.want {
				t.Fatalf("parse %q: %q, %v; want %q", tc.args, *format, err, tc.want)
			}
		})
	}
}

// -h shows -o with its values and its default.
func TestOutputFlagUsage(t *testing.T) {
	var out bytes.Buffer
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(&out)
	OutputFlag(fs)
	fs.PrintDefaults()
	for _, want := range []string{"-o format", "output format: table or json (default table)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}
