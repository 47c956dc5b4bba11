package channelenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
)

// fast is a delivery small enough for tests: linear backoff of 100ms, 200ms,
// ... and one second per request.
func fast(retry int) Delivery {
	return Delivery{Retry: retry, BackoffPolicy: BackoffLinear, BackoffDelay: 100 * time.Millisecond, Timeout: time.Second}
}

// received is one request an endpoint got.
type received struct {
	header http.Header
	event  *event.Event // nil if the request held no CloudEvent
}

// endpoint is an httptest server on 127.0.0.1 that answers the n-th request
// (from 0) with answer(n) and records every request.
type endpoint struct {
	*httptest.Server
	mu  sync.Mutex
	got []received
}

// answer is a response: status, and a body or an event in binary mode,
// after delay (or when the request is cancelled, with no answer).
type answer struct {
	status int
	body   string
	event  *event.Event
	delay  time.Duration
}

func newEndpoint(t *testing.T, answer func(n int) answer) *endpoint {
	t.Helper()
	e := &endpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			ev = nil
		}
		e.mu.Lock()
		n := len(e.got)
		e.got = append(e.got, received{header: r.Header.Clone(), event: ev})
		e.mu.Unlock()
		a := answer(n)
		if a.delay > 0 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(a.delay):
			}
		}
		if a.event != nil {
			if err := cehttp.WriteResponseWriter(r.Context(), binding.ToMessage(a.event), a.status, w); err != nil {
				t.Errorf("write response event: %v", err)
			}
			return
		}
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) received() []received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]received(nil), e.got...)
}

// statuses answers the n-th request with codes[n], the last code ever after.
func statuses(body string, codes ...int) func(int) answer {
	return func(n int) answer {
		return answer{status: codes[min(n, len(codes)-1)], body: body}
	}
}

// refusing returns a URL on 127.0.0.1 that refuses connections.
func refusing(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

func testEvent(id string) event.Event {
	ev := event.New()
	ev.SetID(id)
	ev.SetType("dev.gitea-dynamic-runner.test")
	ev.SetSource("channelenv-test")
	if err := ev.SetData("application/json", map[string]string{"id": id}); err != nil {
		panic(err)
	}
	return ev
}

// post sends ev to the channel's ingress (binary mode unless structured) and
// returns the status.
func post(t *testing.T, ctx context.Context, url string, ev event.Event, structured bool) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx := ctx
	if structured {
		wctx = binding.WithForceStructured(ctx)
	}
	if err := cehttp.WriteRequest(wctx, binding.ToMessage(&ev), req); err != nil {
		t.Fatal(err)
	}
	if structured != (req.Header.Get("Content-Type") == "application/cloudevents+json") {
		t.Fatalf("request Content-Type %q, structured=%v", req.Header.Get("Content-Type"), structured)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body)
	return res.StatusCode
}

// settled waits until the channel's consumer has nothing pending or in
// flight, and returns its state: a message acked, terminated or out of
// deliveries is not delivered again.
func settled(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) *jetstream.ConsumerInfo {
	t.Helper()
	for {
		c, err := js.Consumer(ctx, stream, ConsumerName)
		if err != nil {
			t.Fatalf("consumer %s of %s: %v", ConsumerName, stream, err)
		}
		info := c.CachedInfo()
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return info
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer never settled: %d pending, %d in flight", info.NumPending, info.NumAckPending)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestDispatch(t *testing.T) {
	t.Parallel()
	const busy = "identity target pending"
	for _, tc := range []struct {
		name     string
		delivery Delivery
		answer   func(int) answer // nil: the subscriber refuses connections
		want     []Result         // the attempts' results, in order
		// wantStatus is each attempt's status; wantDead the dead letter's
		// knativeerrorcode, "" for none.
		wantStatus []int
		wantDead   string
		wantData   string // the dead letter's knativeerrordata, base64-decoded (a prefix, without an answer)
	}{
		{name: "2xx acks once", delivery: fast(2), answer: statuses("", http.StatusAccepted),
			want: []Result{Ack}, wantStatus: []int{202}},
		{name: "503 twice then 202", delivery: fast(3), answer: statuses(busy, 503, 503, 202),
			want: []Result{Nak, Nak, Ack}, wantStatus: []int{503, 503, 202}},
		{name: "429 and 408 are retried", delivery: fast(3), answer: statuses("", 429, 408, 200),
			want: []Result{Nak, Nak, Ack}, wantStatus: []int{429, 408, 200}},
		{name: "always 503 is dead-lettered after the retries", delivery: fast(2), answer: statuses(busy, 503),
			want: []Result{Nak, Nak, Nak}, wantStatus: []int{503, 503, 503}, wantDead: "503", wantData: busy},
		{name: "400 terminates, no dead letter before the last try", delivery: fast(2), answer: statuses("poison", 400),
			want: []Result{Term}, wantStatus: []int{400}},
		{name: "400 on the last try is dead-lettered", delivery: fast(0), answer: statuses("poison", 400),
			want: []Result{Term}, wantStatus: []int{400}, wantDead: "400", wantData: "poison"},
		{name: "3xx terminates", delivery: fast(2), answer: statuses("", 302),
			want: []Result{Term}, wantStatus: []int{302}},
		{name: "a subscriber slower than the timeout is naked", delivery: Delivery{Retry: 1, BackoffPolicy: BackoffLinear, BackoffDelay: 100 * time.Millisecond, Timeout: 200 * time.Millisecond},
			answer: func(n int) answer {
				if n == 0 {
					return answer{status: 202, delay: 5 * time.Second}
				}
				return answer{status: 202}
			},
			want: []Result{Nak, Ack}, wantStatus: []int{0, 202}},
		{name: "no answer naks, dead letter reports 500", delivery: fast(1), answer: nil,
			want: []Result{Nak, Nak}, wantStatus: []int{0, 0}, wantDead: "500", wantData: "dispatch error: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			subscriber := ""
			var sub *endpoint
			if tc.answer != nil {
				sub = newEndpoint(t, tc.answer)
				subscriber = sub.URL
			} else {
				subscriber = refusing(t)
			}
			dead := newEndpoint(t, statuses("", http.StatusAccepted))
			_, natsURL := jetstreamenv.Start(t)
			_, js := jetstreamenv.Connect(t, natsURL)
			ch := Start(t, natsURL, Options{Subscriber: subscriber, DeadLetter: dead.URL, Delivery: tc.delivery})

			ev := testEvent("ev-1")
			if code := post(t, ctx, ch.URL(), ev, false); code != http.StatusAccepted {
				t.Fatalf("ingress answered %d, want 202", code)
			}
			attempts, err := ch.WaitDeliveries(ctx, ev.ID(), len(tc.want))
			if err != nil {
				t.Fatal(err)
			}
			info := settled(t, ctx, js, ch.Stream())
			attempts = ch.Deliveries(ev.ID())
			if len(attempts) != len(tc.want) || int(info.Delivered.Consumer) != len(tc.want) {
				t.Fatalf("%d attempts recorded, %d deliveries by JetStream; want %d: %+v", len(attempts), info.Delivered.Consumer, len(tc.want), attempts)
			}
			for i, a := range attempts {
				if a.N != i+1 || a.Result != tc.want[i] || a.Status != tc.wantStatus[i] || a.AckErr != nil {
					t.Errorf("attempt %d: n=%d status=%d result=%s ackErr=%v; want n=%d status=%d result=%s",
						i, a.N, a.Status, a.Result, a.AckErr, i+1, tc.wantStatus[i], tc.want[i])
				}
				if a.Status == 0 && a.Err == nil {
					t.Errorf("attempt %d got no answer and records no error", i)
				}
				if a.Status == 0 && errors.Is(a.Err, context.DeadlineExceeded) {
					// It waited RequestTimeout(n), no more: the next
					// delivery came after it and the backoff.
					if i+1 < len(attempts) {
						if gap, min := attempts[i+1].Time.Sub(a.Time), tc.delivery.RequestTimeout(a.N)+tc.delivery.Backoff(a.N); gap < min || gap > tc.delivery.AckWait()+min {
							t.Errorf("attempt %d timed out and the next came %v later, want at least %v and not much more", i, gap, min)
						}
					}
				}
				if want := tc.delivery.Backoff(a.N); a.Result == Nak && a.Delay != want {
					t.Errorf("attempt %d naked with delay %v, want %v", i, a.Delay, want)
				}
				if i > 0 && attempts[i-1].Result == Nak {
					if gap, min := a.Time.Sub(attempts[i-1].Time), tc.delivery.Backoff(i); gap < min {
						t.Errorf("attempt %d came %v after the previous, before its backoff %v", i, gap, min)
					}
				}
			}
			if sub != nil {
				got := sub.received()
				if len(got) != len(tc.want) {
					t.Fatalf("subscriber got %d requests, want %d", len(got), len(tc.want))
				}
				for i, r := range got {
					if r.header.Get("Prefer") != "reply" || r.header.Get("Ce-Id") != ev.ID() || r.event == nil {
						t.Errorf("request %d: Prefer %q, Ce-Id %q, event %v: want a binary-mode event with Prefer: reply",
							i, r.header.Get("Prefer"), r.header.Get("Ce-Id"), r.event)
					}
				}
			}

			deadGot := dead.received()
			last := attempts[len(attempts)-1]
			if tc.wantDead == "" {
				if len(deadGot) != 0 || last.DeadLetter != nil {
					t.Fatalf("dead letter got %d events (attempt records %+v), want none", len(deadGot), last.DeadLetter)
				}
				return
			}
			if len(deadGot) != 1 || last.DeadLetter == nil || last.DeadLetter.Status != http.StatusAccepted {
				t.Fatalf("dead letter got %d events (attempt records %+v), want 1 accepted", len(deadGot), last.DeadLetter)
			}
			dl := deadGot[0].event
			if dl == nil {
				t.Fatal("dead letter got no CloudEvent")
			}
			if dl.ID() != ev.ID() || dl.Type() != ev.Type() || dl.Source() != ev.Source() || !bytes.Equal(dl.Data(), ev.Data()) {
				t.Errorf("dead letter %s, want the original %s", dl, ev)
			}
			if deadGot[0].header.Get("Prefer") != "" {
				t.Errorf("dead letter sent with Prefer %q, want none", deadGot[0].header.Get("Prefer"))
			}
			ext := dl.Extensions()
			if got := fmt.Sprint(ext[ErrorCodeExtension]); got != tc.wantDead {
				t.Errorf("%s = %q, want %q", ErrorCodeExtension, got, tc.wantDead)
			}
			if got := fmt.Sprint(ext[ErrorDestExtension]); got != subscriber {
				t.Errorf("%s = %q, want %q", ErrorDestExtension, got, subscriber)
			}
			data, err := base64.StdEncoding.DecodeString(fmt.Sprint(ext[ErrorDataExtension]))
			if err != nil {
				t.Fatalf("%s %q: %v", ErrorDataExtension, ext[ErrorDataExtension], err)
			}
			if tc.answer != nil && string(data) != tc.wantData || !strings.HasPrefix(string(data), tc.wantData) {
				t.Errorf("%s decodes to %q, want %q", ErrorDataExtension, data, tc.wantData)
			}
		})
	}
}

func TestDuplicateEventIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sub := newEndpoint(t, statuses("", http.StatusAccepted))
	_, natsURL := jetstreamenv.Start(t)
	_, js := jetstreamenv.Connect(t, natsURL)
	ch := Start(t, natsURL, Options{Subscriber: sub.URL, Delivery: fast(2)})

	ev := testEvent("dup-1")
	// Once in binary mode, then in structured mode: the same event.
	for _, structured := range []bool{false, true} {
		if code := post(t, ctx, ch.URL(), ev, structured); code != http.StatusAccepted {
			t.Fatalf("ingress answered %d (structured %v), want 202", code, structured)
		}
	}
	if _, err := ch.WaitDeliveries(ctx, ev.ID(), 1); err != nil {
		t.Fatal(err)
	}
	// Another event after the duplicate: once it is delivered, the duplicate
	// would have been too.
	other := testEvent("other-1")
	if code := post(t, ctx, ch.URL(), other, true); code != http.StatusAccepted {
		t.Fatalf("ingress answered %d, want 202", code)
	}
	if _, err := ch.WaitDeliveries(ctx, other.ID(), 1); err != nil {
		t.Fatal(err)
	}
	info := settled(t, ctx, js, ch.Stream())
	st, err := js.Stream(ctx, ch.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("stream holds %d messages, want 2 (the duplicate dropped)", n)
	}
	if got := ch.Deliveries(ev.ID()); len(got) != 1 || info.Delivered.Consumer != 2 || len(sub.received()) != 2 {
		t.Fatalf("duplicated event: %d attempts, %d deliveries of both events by JetStream, subscriber got %d requests; want 1, 2, 2",
			len(got), info.Delivered.Consumer, len(sub.received()))
	}
}

func TestReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		replyStatus int
		wantDead    bool
	}{
		{"the response event goes to the reply URL", http.StatusAccepted, false},
		{"a failed reply dead-letters the original", http.StatusInternalServerError, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			response := testEvent("response-1")
			response.SetType("dev.gitea-dynamic-runner.test.response")
			sub := newEndpoint(t, func(int) answer { return answer{status: http.StatusOK, event: &response} })
			reply := newEndpoint(t, statuses("reply down", tc.replyStatus))
			dead := newEndpoint(t, statuses("", http.StatusAccepted))
			_, natsURL := jetstreamenv.Start(t)
			_, js := jetstreamenv.Connect(t, natsURL)
			ch := Start(t, natsURL, Options{Subscriber: sub.URL, Reply: reply.URL, DeadLetter: dead.URL, Delivery: fast(2)})

			ev := testEvent("ev-1")
			if code := post(t, ctx, ch.URL(), ev, false); code != http.StatusAccepted {
				t.Fatalf("ingress answered %d, want 202", code)
			}
			attempts, err := ch.WaitDeliveries(ctx, ev.ID(), 1)
			if err != nil {
				t.Fatal(err)
			}
			info := settled(t, ctx, js, ch.Stream())
			a := attempts[0]
			if a.Result != Ack || a.Status != http.StatusOK || info.Delivered.Consumer != 1 {
				t.Fatalf("attempt %+v, %d deliveries: want one, acked with 200", a, info.Delivered.Consumer)
			}
			got := reply.received()
			if len(got) != 1 || got[0].event == nil {
				t.Fatalf("reply URL got %d requests (%+v), want the response event", len(got), got)
			}
			if r := got[0].event; r.ID() != response.ID() || r.Type() != response.Type() || !bytes.Equal(r.Data(), response.Data()) {
				t.Errorf("reply URL got %s, want %s", r, response)
			}
			if a.Reply == nil || a.Reply.Status != tc.replyStatus {
				t.Errorf("attempt records reply %+v, want status %d", a.Reply, tc.replyStatus)
			}

			deadGot := dead.received()
			if !tc.wantDead {
				if len(deadGot) != 0 || a.DeadLetter != nil {
					t.Fatalf("dead letter got %d events, want none", len(deadGot))
				}
				return
			}
			if len(deadGot) != 1 || deadGot[0].event == nil || a.DeadLetter == nil {
				t.Fatalf("dead letter got %d requests, want the original event", len(deadGot))
			}
			dl := deadGot[0].event
			ext := dl.Extensions()
			if dl.ID() != ev.ID() || dl.Type() != ev.Type() ||
				fmt.Sprint(ext[ErrorDestExtension]) != reply.URL || fmt.Sprint(ext[ErrorCodeExtension]) != strconv.Itoa(tc.replyStatus) ||
				fmt.Sprint(ext[ErrorDataExtension]) != base64.StdEncoding.EncodeToString([]byte("reply down")) {
				t.Errorf("dead letter %s, want the original event with the reply's failure", dl)
			}
		})
	}
}

func TestIngressRejects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, natsURL := jetstreamenv.Start(t)
	ch := Start(t, natsURL, Options{Subscriber: refusing(t), Delivery: fast(0)})
	big := testEvent("big")
	if err := big.SetData("text/plain", strings.Repeat("x", MaxEventBytes)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, contentType, body string
		want                            int
	}{
		{"GET", http.MethodGet, "", "", http.StatusMethodNotAllowed},
		{"not a CloudEvent", http.MethodPost, "application/json", `{"a":1}`, http.StatusBadRequest},
		{"structured without an id", http.MethodPost, "application/cloudevents+json", `{"specversion":"1.0","type":"t","source":"s"}`, http.StatusBadRequest},
		{"over the cap", http.MethodPost, "application/cloudevents+json", func() string { b, _ := big.MarshalJSON(); return string(b) }(), http.StatusRequestEntityTooLarge},
	} {
		req, err := http.NewRequestWithContext(ctx, tc.method, ch.URL(), strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s: ingress answered %d, want %d", tc.name, res.StatusCode, tc.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	good := Options{Subscriber: "http://127.0.0.1:1", Delivery: fast(1)}
	if err := good.validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"no subscriber", func(o *Options) { o.Subscriber = "" }, "Subscriber"},
		{"relative reply", func(o *Options) { o.Reply = "/reply" }, "Reply"},
		{"dead letter not http", func(o *Options) { o.DeadLetter = "nats://127.0.0.1:1" }, "DeadLetter"},
		{"no timeout", func(o *Options) { o.Delivery.Timeout = 0 }, "delivery.timeout"},
		{"negative max ack pending", func(o *Options) { o.MaxAckPending = -1 }, "MaxAckPending"},
	} {
		o := good
		tc.change(&o)
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: validate = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}
