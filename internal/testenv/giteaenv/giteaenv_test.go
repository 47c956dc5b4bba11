package giteaenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// fakeTB records how Binary ends a test without ending the real one.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) {
	f.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, a ...any) {
	f.failed = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// binaryOutcome runs Binary on its own goroutine (Skip/Fatal end it with Goexit).
func binaryOutcome() (skipped, failed string) {
	var f fakeTB
	done := make(chan struct{})
	go func() { defer close(done); Binary(&f) }()
	<-done
	return f.skipped, f.failed
}

// TestBinaryMissing: a missing peer skips a developer's test but fails under CI=true.
func TestBinaryMissing(t *testing.T) {
	t.Setenv("GDR_GITEA_BIN", t.TempDir()+"/no-such-gitea")
	t.Setenv("CI", "")
	if skipped, failed := binaryOutcome(); !strings.Contains(skipped, "make peers") || failed != "" {
		t.Fatalf("without CI: skipped=%q failed=%q", skipped, failed)
	}
	t.Setenv("CI", "true")
	if skipped, failed := binaryOutcome(); !strings.Contains(failed, "make peers") || skipped != "" {
		t.Fatalf("with CI=true: skipped=%q failed=%q", skipped, failed)
	}
}
