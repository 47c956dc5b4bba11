package taskassignment

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestReasonLine(t *testing.T) {
	long := strings.Repeat("é", MaxReason) // 2 bytes each: cut mid-rune at MaxReason
	for _, tc := range []struct{ in, want string }{
		{"pool linux has no profile", "pool linux has no profile"},
		{"line one\nline two\r\n", "line one line two"},
		{"tab\tand\x00nul\x7f", "tab and nul"},
		{"bad \xff byte", "bad ? byte"},
	} {
		if got := ReasonLine(tc.in); got != tc.want {
			t.Errorf("ReasonLine(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	got := ReasonLine(long)
	if len(got) > MaxReason || !utf8.ValidString(got) || len(got) < MaxReason-1 {
		t.Errorf("a long reason: %d bytes, valid UTF-8 %v; want at most %d, valid", len(got), utf8.ValidString(got), MaxReason)
	}
}
