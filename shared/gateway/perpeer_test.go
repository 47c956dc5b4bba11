package gateway

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/svidca"
)

// One executor with MaxRequestsPerPeer requests in flight (a runner that
// never reads its answers, or floods) gets 429 for the next one, unread,
// while another executor is still served; once one of its requests ends it
// is served again.
func TestRequestsInFlightCappedPerPeer(t *testing.T) {
	ca, err := svidca.New(td)
	if err != nil {
		t.Fatal(err)
	}
	request := func(n int64) *http.Request {
		svid, err := ca.Mint(taskID(n), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/runner.v1.RunnerService/UpdateLog", nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: svid.Certificates}
		return r
	}
	// The handler holds each request until its executor's release.
	releases := map[string]chan struct{}{taskID(1).String(): make(chan struct{}), taskID(2).String(): make(chan struct{})}
	entered := make(chan struct{}, MaxRequestsPerPeer)
	g := &Gateway{}
	h := g.perPeer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-releases[peerID(r).String()]
		w.WriteHeader(http.StatusOK)
	}))
	serve := func(n int64) <-chan int {
		code := make(chan int, 1)
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request(n))
			code <- rec.Code
		}()
		return code
	}
	var held []<-chan int
	for range MaxRequestsPerPeer {
		held = append(held, serve(1))
	}
	for range MaxRequestsPerPeer {
		<-entered // the fault: executor 1 holds the cap, all in the handler
	}
	over := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(1))
		over <- rec
	}()
	select {
	case rec := <-over:
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("request %d of one executor: %d %q, want 429 with Retry-After", MaxRequestsPerPeer+1, rec.Code, rec.Body.String())
		}
	case <-entered:
		t.Fatalf("request %d of one executor reached the handler: no cap per peer", MaxRequestsPerPeer+1)
	case <-time.After(5 * time.Second):
		t.Fatalf("request %d of one executor neither refused nor served within 5 s", MaxRequestsPerPeer+1)
	}
	other := serve(2)
	<-entered // another executor's request reaches the handler meanwhile
	releases[taskID(2).String()] <- struct{}{}
	if code := <-other; code != http.StatusOK {
		t.Fatalf("another executor: %d, want 200", code)
	}
	releases[taskID(1).String()] <- struct{}{} // one of executor 1's requests ends
	ended := false
	for !ended {
		for i, c := range held {
			select {
			case code := <-c:
				if code != http.StatusOK {
					t.Fatalf("a held request: %d", code)
				}
				held, ended = append(held[:i], held[i+1:]...), true
			default:
				continue
			}
			break
		}
		if !ended {
			time.Sleep(time.Millisecond)
		}
	}
	again := serve(1)
	<-entered
	close(releases[taskID(1).String()])
	if code := <-again; code != http.StatusOK {
		t.Fatalf("executor 1 after one of its requests ended: %d, want 200", code)
	}
	for _, c := range held {
		<-c
	}
	if len(g.inFlight.peers) != 0 {
		t.Fatalf("peers still counted after every request ended: %v", g.inFlight.peers)
	}
}
