package opensandboxenv

import (
	"fmt"
	"strings"
	"time"
)

// serverConfig is the lifecycle server's sandbox.toml, shared by both
// runtimes: the server on 127.0.0.1:port with apiKey and maxTimeout (whole
// seconds), runtime type rtype with execdImage, a SQLite store in the
// chroot's tmpfs /tmp, direct ingress, and extra (the runtime's own
// sections) appended.
func serverConfig(port int, apiKey string, maxTimeout time.Duration, rtype, execdImage, extra string) string {
	return fmt.Sprintf(`[server]
host = "127.0.0.1"
port = %d
api_key = %q
max_sandbox_timeout_seconds = %d

[log]
level = "INFO"

[runtime]
type = %q
execd_image = %q

[store]
type = "sqlite"
path = "/tmp/opensandbox.db"

[ingress]
mode = "direct"

%s`, port, apiKey, int(maxTimeout/time.Second), rtype, execdImage, extra)
}

// serverScript is the part of a namespace's init script (sh, in a private
// mount namespace) that starts the lifecycle server in the background: a
// read-only bind of the peer's root ($P/root) on $R, with its own /proc,
// the machine's /dev, tmpfs /tmp (the store) and /root (HOME), and $D/srv
// (sandbox.toml and what the runtime needs) as /run; then chroot into it,
// python3 -m opensandbox_server.cli --config /run/sandbox.toml, its output
// in $D/server.log. env adds NAME=value pairs to the server's otherwise
// empty environment (values must need no shell quoting). The script must
// set D, P and R before, and `wait` after.
func serverScript(env ...string) string {
	extra := ""
	if len(env) > 0 {
		extra = strings.Join(env, " ") + " "
	}
	return `mount --bind "$P/root" "$R"
mount -o remount,bind,ro "$R"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=1777 gdr-osd-tmp "$R/tmp"
mount -t tmpfs -o mode=0700 gdr-osd-home "$R/root"
mount --bind "$D/srv" "$R/run"
chroot "$R" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 PYTHONPATH=/opt/server \
  PYTHONDONTWRITEBYTECODE=1 ` + extra + `\
  python3 -m opensandbox_server.cli --config /run/sandbox.toml >"$D/server.log" 2>&1 &
`
}
