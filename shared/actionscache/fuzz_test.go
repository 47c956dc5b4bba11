package actionscache

import (
	"net"
	"net/url"
	"testing"
)

// Whatever a caller sends as HeaderBase, an accepted base is an http URL of
// a loopback address: an archive location never points a job elsewhere.
func FuzzArchiveBase(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:1/x/", "http://[::1]:2/", "http://evil@127.0.0.1:1/", "http://127.0.0.1.evil.org:1/", "http://0x7f.1:1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		base, err := archiveBase(raw)
		if err != nil {
			return
		}
		u, err := url.Parse(base)
		if err != nil || u.Scheme != "http" || u.User != nil {
			t.Fatalf("accepted %q as %q", raw, base)
		}
		if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
			t.Fatalf("accepted %q: host %q is not loopback", raw, u.Hostname())
		}
	})
}

// covers accepts exactly the chunk sets that leave no byte of [0, size)
// out and none past it.
func FuzzCovers(f *testing.F) {
	f.Add(int64(0), int64(5), int64(5), int64(5), int64(10))
	f.Add(int64(0), int64(4), int64(5), int64(5), int64(10))
	f.Fuzz(func(t *testing.T, a, an, b, bn, size int64) {
		if a < 0 || b < 0 || an <= 0 || bn <= 0 || a > 1<<40 || b > 1<<40 || an > 1<<40 || bn > 1<<40 || size > 1<<41 {
			return
		}
		parts := map[int64]int64{a: an}
		if b != a {
			parts[b] = bn
		}
		err := covers(parts, size)
		// the reference: mark each byte of a small range
		if size < 0 || size > 4096 || a+an > 4096 || b+bn > 4096 {
			return
		}
		seen := make([]bool, 8192)
		end := int64(0)
		for off, n := range parts {
			for i := off; i < off+n; i++ {
				seen[i] = true
			}
			end = max(end, off+n)
		}
		want := end == size
		for i := int64(0); i < size && want; i++ {
			want = seen[i]
		}
		if (err == nil) != want {
			t.Fatalf("covers(%v, %d) = %v, want ok=%v", parts, size, err, want)
		}
	})
}
