package taskassignment

import (
	"strings"
	"testing"
)

func TestJobImage(t *testing.T) {
	for _, tc := range []struct {
		payload, want, wantErr string
	}{
		{"jobs:\n  b:\n    runs-on: x\n", "", ""},
		{"jobs:\n  b:\n    container: alpine:3\n", "alpine:3", ""},
		{"jobs:\n  b:\n    container:\n      image: ghcr.io/o/i@sha256:00\n      options: --cpus 1\n", "ghcr.io/o/i@sha256:00", ""},
		{"jobs:\n  b:\n    container:\n      options: x\n", "", "no image"},
		{"jobs:\n  b:\n    container: [a]\n", "", "want an image"},
		{"jobs: {}\n", "", "0 jobs"},
		{"jobs: [\n", "", "not YAML"},
	} {
		got, err := JobImage([]byte(tc.payload))
		if got != tc.want || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("JobImage(%q) = %q, %v; want %q, error %q", tc.payload, got, err, tc.want, tc.wantErr)
		}
	}
}
