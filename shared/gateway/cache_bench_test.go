package gateway

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// BenchmarkCacheSaveRestore measures a 100 MiB cache archive saved and
// restored the way @actions/cache does it (reserve; PATCH 32 MiB chunks,
// 4 at once, read from the archive file; commit; look up; download to a
// file), through the runner's loopback proxy, the gateway's SPIFFE mTLS
// and payload binding, into a Dir on the same disk as the archive. Next to
// it, a plain copy of the same file on that disk: the physical limit.
//
//	go test -run '^$' -bench CacheSaveRestore -benchtime 3x ./shared/gateway/
func BenchmarkCacheSaveRestore(b *testing.B) {
	const size, chunk, concurrency = 100 << 20, 32 << 20, 4
	f := cacheFixtureOf(b, 1<<30)
	id := spiffeid.RequireFromPath(td, "/repo/alice/repo/task/21")
	proxy := f.cacheProxy(b, id, "linux-21", f.boot.Capability("linux-21", 21, id.String()))
	dir := b.TempDir()
	archive := filepath.Join(dir, "archive.tzst")
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(archive, data, 0o600); err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Minute}
	do := func(method, url string, body io.Reader, n int64, hdr ...string) *http.Response {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			b.Fatal(err)
		}
		if n >= 0 {
			req.ContentLength = n
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if res.StatusCode/100 != 2 {
			msg, _ := io.ReadAll(res.Body)
			b.Fatalf("%s %s: %d %s", method, url, res.StatusCode, msg)
		}
		return res
	}
	var save, restore, copying time.Duration
	b.ResetTimer()
	for i := range b.N {
		key := "bench-" + strconv.Itoa(i)
		start := time.Now()
		res := do("POST", proxy+"_apis/artifactcache/caches", strings.NewReader(fmt.Sprintf(`{"key":%q,"version":"v","cacheSize":%d}`, key, size)), -1)
		var r struct{ CacheID int64 }
		_ = json.NewDecoder(res.Body).Decode(&r)
		res.Body.Close()
		cacheURL := proxy + "_apis/artifactcache/caches/" + strconv.FormatInt(r.CacheID, 10)
		file, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		offsets := make(chan int64, size/chunk+1)
		for off := int64(0); off < size; off += chunk {
			offsets <- off
		}
		close(offsets)
		for range concurrency {
			wg.Go(func() {
				for off := range offsets {
					n := min(int64(chunk), size-off)
					res := do("PATCH", cacheURL, io.NewSectionReader(file, off, n), n,
						"Content-Type", "application/octet-stream", "Content-Range", fmt.Sprintf("bytes %d-%d/*", off, off+n-1))
					res.Body.Close()
				}
			})
		}
		wg.Wait()
		file.Close()
		do("POST", cacheURL, strings.NewReader(fmt.Sprintf(`{"size":%d}`, size)), -1).Body.Close()
		save += time.Since(start)

		start = time.Now()
		res = do("GET", proxy+"_apis/artifactcache/cache?keys="+key+"&version=v", nil, -1)
		var hit struct{ ArchiveLocation string }
		_ = json.NewDecoder(res.Body).Decode(&hit)
		res.Body.Close()
		res = do("GET", hit.ArchiveLocation, nil, -1)
		got, err := os.Create(filepath.Join(dir, "restored.tzst"))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(got, res.Body)
		res.Body.Close()
		got.Close()
		if err != nil || n != size {
			b.Fatalf("restored %d bytes: %v", n, err)
		}
		restore += time.Since(start)

		start = time.Now()
		src, _ := os.Open(archive)
		dst, _ := os.Create(filepath.Join(dir, "copy.tzst"))
		if _, err := io.Copy(dst, src); err != nil {
			b.Fatal(err)
		}
		src.Close()
		dst.Close()
		copying += time.Since(start)
	}
	mib := float64(size) / (1 << 20) * float64(b.N)
	b.ReportMetric(mib/save.Seconds(), "save-MiB/s")
	b.ReportMetric(mib/restore.Seconds(), "restore-MiB/s")
	b.ReportMetric(mib/copying.Seconds(), "copy-MiB/s")
}
