package reporter

import (
	"strings"
	"testing"
)

func TestMasker(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		in     string
		want   string
	}{
		{"none", nil, "a secret", "a secret"},
		{"every occurrence", []string{"s3"}, "s3 and s3s3", "*** and ***"},
		{"longest wins", []string{"abc", "abcdef"}, "xabcdefx", "x***x"},
		{"overlap keeps no tail", []string{"abc", "bcdefgh"}, "abcdefgh!", "***!"},
		{"multi-line value, each line", []string{"line-one\r\n  line-two  \n"}, "line-one / line-two / line-one\r\n  line-two  \n", "*** / *** / ***"},
		{"trimmed value", []string{" padded\n"}, "is padded", "is ***"},
		{"blank values ignored", []string{"", "  ", "\n"}, "a b", "a b"},
		{"invalid UTF-8 bytes", []string{"\xff\xfe"}, "x\xff\xfey", "x***y"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m masker
			for _, v := range tt.values {
				m.add(v)
			}
			if got := m.mask(tt.in); got != tt.want {
				t.Errorf("mask(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestMaskerAddReportsNew(t *testing.T) {
	var m masker
	if !m.add("x1") || m.add("x1") || m.add("") {
		t.Fatal("add must report only new values")
	}
	if m.mask(strings.Repeat("x1", 3)) != "***" {
		t.Fatal("adjacent occurrences should merge")
	}
}

func FuzzMaskerHidesValues(f *testing.F) {
	f.Add("abc", "bcd", "zabcdz")
	f.Add("a\nb", "xy", "a b xy")
	f.Fuzz(func(t *testing.T, v1, v2, text string) {
		var m masker
		m.add(v1)
		m.add(v2)
		got := m.mask(text)
		// Unmasked text is original text that overlaps no occurrence, so
		// a value without '*' cannot appear in the result.
		for _, v := range m.values {
			if !strings.Contains(v, "*") && strings.Contains(got, v) {
				t.Fatalf("mask(%q) = %q still holds %q", text, got, v)
			}
		}
	})
}
