// Package buildseccomp makes the seccomp profile of a pool's build sidecar
// (rootless BuildKit, shared/backend/pod Build): containerd's default
// profile for a container holding CAP_SETUID and CAP_SETGID, and an allow
// rule for the few system calls RootlessKit and runc need to make the
// build's user, mount and network namespaces, which that default refuses a
// container without CAP_SYS_ADMIN. Every other rule is containerd's, so a
// change of containerd's default comes in with its module version.
//
// The profile is per architecture (containerd's default names the
// architecture's system calls): deploy/seccomp/buildkit-<GOARCH>.json is
// this package's output on that architecture, checked by its test.
package buildseccomp

import (
	"encoding/json"
	"fmt"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Capabilities are the build sidecar's only capabilities: newuidmap's and
// newgidmap's, to map its subordinate IDs into BuildKit's user namespace.
func Capabilities() []string { return []string{"CAP_SETUID", "CAP_SETGID"} }

// NamespaceSyscalls are what the profile allows beyond containerd's default:
// a new user namespace and what its owner then does in it (clone, unshare,
// setns; mounts, new and old API; pivot_root; the UTS names; the session
// keyring runc makes). Each is checked by the kernel against capabilities
// in the new user namespace, not the node's.
func NamespaceSyscalls() []string {
	return []string{"unshare", "clone", "clone3", "setns",
		"mount", "umount2", "mount_setattr", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "pivot_root",
		"sethostname", "setdomainname", "keyctl"}
}

// Profile returns the profile for the architecture this runs on, as the
// kubelet reads a Localhost profile (the OCI runtime spec's LinuxSeccomp),
// indented, with a final newline.
func Profile() ([]byte, error) {
	caps := Capabilities()
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: caps, Effective: caps, Permitted: caps,
	}}}
	p := seccomp.DefaultProfile(spec)
	p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: NamespaceSyscalls(), Action: specs.ActAllow})
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("build seccomp profile: %w", err)
	}
	return append(b, '\n'), nil
}
