package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGiteaClientKeepsItsConnections: the gateway's calls to Gitea come in
// bursts of many executors' reports at once; a second burst as large as the
// first finds the first one's connections idle and opens none (Go's default
// transport would keep 2 and open the rest again).
func TestGiteaClientKeepsItsConnections(t *testing.T) {
	const calls = 32
	var opened atomic.Int64
	var arrived sync.WaitGroup
	release := make(chan struct{})
	var mu sync.Mutex
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		mu.Lock()
		ch := release
		mu.Unlock()
		<-ch // every call of the burst in flight at once
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	hc := giteaHTTPClient()
	for burst := 1; burst <= 2; burst++ {
		arrived.Add(calls)
		var done sync.WaitGroup
		for range calls {
			done.Add(1)
			go func() {
				defer done.Done()
				resp, err := hc.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}()
		}
		arrived.Wait()
		mu.Lock()
		close(release)
		release = make(chan struct{})
		mu.Unlock()
		done.Wait()
		if got := opened.Load(); got != calls {
			t.Fatalf("after burst %d of %d concurrent calls: %d connections opened, want %d (each burst's calls on the first burst's connections)", burst, calls, got, calls)
		}
	}
}
