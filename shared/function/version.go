package function

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// Version is what a binary knows about its own build, read from the build
// information the Go toolchain embeds (module version, VCS revision and
// time, Go version), and the commit the build stamped (stamp) where the
// toolchain recorded none: a reproducible build needs nothing but the same
// source, toolchain and stamp.
type Version struct {
	// Module is the main module's version ("(devel)" when the toolchain
	// could not derive one).
	Module string
	// Commit is the VCS revision, empty when built outside a checkout (or
	// with -buildvcs=false); Modified says the checkout had local changes.
	Commit   string
	Modified bool
	// Time is the commit's time (RFC 3339), not the build's: two builds of
	// one commit say the same.
	Time string
	Go   string
}

// stamp is the commit the build says it was made from, set by the linker:
// make build, make run and make images pass
//
//	-ldflags "-X github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function.stamp=<revision>[+modified]"
//
// ("+modified" when the checkout had changes). The toolchain's own record of
// the commit is missing when it builds with -buildvcs=false (in GOFLAGS, as
// some toolchains and CI images set it) or outside a checkout; the stamp is
// there all the same. Empty: not stamped.
var stamp string

// stampModified ends a stamp made from a checkout with local changes.
const stampModified = "+modified"

// BuildVersion reads the running binary's Version.
func BuildVersion() Version {
	return buildVersion(stamp)
}

// buildVersion is BuildVersion with the stamp given: the stamp when the
// build set one (the build's word), the toolchain's VCS record otherwise.
func buildVersion(stamp string) Version {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = &debug.BuildInfo{Main: debug.Module{Version: "unknown"}, GoVersion: "unknown"}
	}
	v := Version{Module: info.Main.Version, Go: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	if stamp != "" {
		recorded := v.Commit
		v.Commit, v.Modified = strings.CutSuffix(stamp, stampModified)
		if recorded != v.Commit {
			v.Time = "" // the recorded time is another commit's
		}
	}
	return v
}

// String is the one line `--version` prints after the program's name:
// "<module version> commit <revision>[ (modified)] <commit time> <go version>",
// leaving out what the build does not know.
func (v Version) String() string {
	parts := []string{v.Module}
	if v.Commit != "" {
		c := "commit " + v.Commit
		if v.Modified {
			c += " (modified)"
		}
		parts = append(parts, c)
	}
	if v.Time != "" {
		parts = append(parts, v.Time)
	}
	parts = append(parts, v.Go)
	return strings.Join(parts, " ")
}

// PrintVersion writes "<name> <version>" and a newline to w.
func PrintVersion(w io.Writer, name string) {
	fmt.Fprintf(w, "%s %s\n", name, BuildVersion())
}
