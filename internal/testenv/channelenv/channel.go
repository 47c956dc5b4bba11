package channelenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/jetstreamenv"
)

const (
	// MaxEventBytes caps the body of a request to the ingress.
	MaxEventBytes = 64 << 10
	// DuplicateWindow is the stream's deduplication window: an event whose
	// ID was stored less than this long ago is not stored again.
	DuplicateWindow = 2 * time.Minute
	// DefaultMaxAckPending is the consumer's MaxAckPending when Options sets
	// none.
	DefaultMaxAckPending = 10
	// FetchBatch and FetchMaxWait are the dispatcher's pull requests: up to
	// FetchBatch messages, waiting at most FetchMaxWait (eventing-natss's
	// defaults).
	FetchBatch   = 32
	FetchMaxWait = 200 * time.Millisecond
	// ConsumerName is the durable name of the dispatcher's consumer.
	ConsumerName = "dispatcher"
)

// The extensions a dead-lettered event carries, as Knative names them.
const (
	// ErrorCodeExtension is the failed delivery's HTTP status as a decimal
	// string; 500 when the delivery got no answer, as Knative reports it.
	ErrorCodeExtension = "knativeerrorcode"
	// ErrorDestExtension is the URL the failed delivery went to (the
	// subscriber, or the reply URL when the reply failed).
	ErrorDestExtension = "knativeerrordest"
	// ErrorDataExtension is the base64 (standard encoding) of the failed
	// delivery's response body, cut to ErrorDataMax characters; without an
	// answer, of "dispatch error: " and the error, as Knative reports it.
	ErrorDataExtension = "knativeerrordata"
	// ErrorDataMax is the longest ErrorDataExtension.
	ErrorDataMax = 1024
)

// structuredContentType is the Content-Type header of a stored message.
const structuredContentType = "application/cloudevents+json"

// maxResponseBytes caps what the dispatcher reads of a response body.
const maxResponseBytes = 1 << 20

// publishTimeout bounds the ingress's publish of one event.
const publishTimeout = 5 * time.Second

// Options configure a Channel.
type Options struct {
	// Subscriber is the URL the dispatcher delivers every event to; required.
	Subscriber string
	// Reply, if set, is where an event the subscriber answers with (in a 2xx
	// response) goes.
	Reply string
	// DeadLetter, if set, is where an event goes whose last try failed, and
	// the original event when forwarding the subscriber's response to Reply
	// failed.
	DeadLetter string
	// Delivery is the subscription's spec.delivery (LoadDelivery reads a
	// manifest's); it must pass Delivery.Validate.
	Delivery Delivery
	// MaxAckPending bounds the deliveries in flight; 0 means
	// DefaultMaxAckPending.
	MaxAckPending int
	// Stream names the channel's stream; empty means a name unique to the
	// Channel.
	Stream string
}

// Result is what the dispatcher told JetStream after a delivery.
type Result string

const (
	Ack  Result = "ack"  // 2xx: done
	Nak  Result = "nak"  // 5xx, 429, 408 or no answer: deliver again after Attempt.Delay
	Term Result = "term" // any other status: never deliver again
)

// Forward is one request the dispatcher sent beyond the subscriber: a reply
// or a dead letter.
type Forward struct {
	URL    string
	Status int   // the HTTP status; 0 if there was no answer
	Err    error // why there was no answer, or why the status is a failure
}

// Attempt is one delivery of an event to the subscriber, recorded once the
// dispatcher has finished with it (acked, naked or terminated it and sent
// any reply and dead letter).
type Attempt struct {
	Time   time.Time     // when the request to the subscriber was sent
	N      int           // JetStream's NumDelivered of this delivery, from 1
	Status int           // the subscriber's HTTP status; 0 if it did not answer
	Err    error         // why the subscriber did not answer, when Status is 0
	Result Result        // what the dispatcher told JetStream
	Delay  time.Duration // the nak's delay, when Result is Nak
	// AckErr is the error acking, naking or terminating returned, if any.
	AckErr error
	// Reply is the forward of the subscriber's response event, if there
	// was one.
	Reply *Forward
	// DeadLetter is the dead-letter send of the original event, if there
	// was one.
	DeadLetter *Forward
}

// Channel is a running stand-in channel. Its methods are safe for
// concurrent use.
type Channel struct {
	opts     Options
	delivery Delivery
	stream   string
	subject  string
	url      string
	js       jetstream.JetStream
	client   *http.Client
	logf     func(format string, args ...any)

	mu       sync.Mutex
	attempts map[string][]Attempt // by event ID, in the order of Attempt.Time
	changed  chan struct{}        // closed and replaced on every record
}

// Start creates the channel's stream and consumer on the JetStream server at
// natsURL (over a connection of its own), starts the ingress and the
// dispatcher and returns the Channel. It fails the test if opts are invalid
// or any part cannot start. The test's Cleanup stops the ingress and the
// dispatcher and waits for every goroutine they started; deliveries still in
// flight then are cancelled.
func Start(t testing.TB, natsURL string, opts Options) *Channel {
	t.Helper()
	if err := opts.validate(); err != nil {
		t.Fatalf("channelenv: %v", err)
	}
	_, js := jetstreamenv.Connect(t, natsURL)
	c := &Channel{
		opts:     opts,
		delivery: opts.Delivery,
		stream:   opts.Stream,
		js:       js,
		client:   &http.Client{},
		logf:     t.Logf,
		attempts: make(map[string][]Attempt),
		changed:  make(chan struct{}),
	}
	if c.stream == "" {
		c.stream = "CHANNELENV_" + randomHex(8)
	}
	c.subject = "channelenv." + c.stream
	maxAckPending := opts.MaxAckPending
	if maxAckPending == 0 {
		maxAckPending = DefaultMaxAckPending
	}

	// t.Context is cancelled before the Cleanup below runs: it bounds every
	// loop and request of the dispatcher.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var srv *http.Server
	t.Cleanup(func() {
		cancel()
		if srv != nil {
			shutdown, done := context.WithTimeout(context.Background(), publishTimeout)
			defer done()
			if err := srv.Shutdown(shutdown); err != nil {
				t.Errorf("channelenv: channel %s: stop ingress: %v", c.stream, err)
			}
		}
		wg.Wait()
	})

	setup, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	if _, err := js.CreateOrUpdateStream(setup, jetstream.StreamConfig{
		Name:       c.stream,
		Subjects:   []string{c.subject},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Duplicates: DuplicateWindow,
	}); err != nil {
		t.Fatalf("channelenv: channel %s: create stream: %v", c.stream, err)
	}
	consumer, err := js.CreateOrUpdateConsumer(setup, c.stream, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.delivery.AckWait(),
		MaxDeliver:    c.delivery.MaxDeliver(),
		MaxAckPending: maxAckPending,
	})
	if err != nil {
		t.Fatalf("channelenv: channel %s: create consumer %s: %v", c.stream, ConsumerName, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("channelenv: channel %s: listen: %v", c.stream, err)
	}
	c.url = "http://" + ln.Addr().String()
	srv = &http.Server{
		Handler:           http.HandlerFunc(c.ingress),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       30 * time.Second,
	}
	wg.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			c.logf("channelenv: channel %s: ingress: %v", c.stream, err)
		}
	})
	wg.Go(func() { c.fetchLoop(ctx, consumer, &wg) })
	return c
}

// validate reports what in o Start cannot work with.
func (o Options) validate() error {
	if err := checkURL("Subscriber", o.Subscriber); err != nil {
		return err
	}
	for _, u := range []struct{ name, value string }{{"Reply", o.Reply}, {"DeadLetter", o.DeadLetter}} {
		if u.value == "" {
			continue
		}
		if err := checkURL(u.name, u.value); err != nil {
			return err
		}
	}
	if err := o.Delivery.Validate(); err != nil {
		return fmt.Errorf("options: %w", err)
	}
	if o.MaxAckPending < 0 {
		return fmt.Errorf("options: MaxAckPending is %d: want 0 (the default) or more", o.MaxAckPending)
	}
	return nil
}

// checkURL reports whether s, the option name, is an absolute http(s) URL.
func checkURL(name, s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("options: %s: %w", name, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("options: %s is %q: want an absolute http or https URL", name, s)
	}
	return nil
}

// URL is the ingress's URL, http://127.0.0.1:<port>: POST CloudEvents to it.
func (c *Channel) URL() string { return c.url }

// Stream is the name of the channel's stream; its consumer is ConsumerName.
func (c *Channel) Stream() string { return c.stream }

// Delivery is the delivery the channel was started with.
func (c *Channel) Delivery() Delivery { return c.delivery }

// Deliveries returns the attempts to deliver the event with ID eventID so
// far, oldest first.
func (c *Channel) Deliveries(eventID string) []Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.attempts[eventID])
}

// WaitDeliveries waits until at least n attempts to deliver the event with ID
// eventID are recorded, and returns them all, oldest first. If ctx ends first
// it returns those there are and an error naming the event and ctx's cause.
func (c *Channel) WaitDeliveries(ctx context.Context, eventID string, n int) ([]Attempt, error) {
	for {
		c.mu.Lock()
		got := slices.Clone(c.attempts[eventID])
		changed := c.changed
		c.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return got, fmt.Errorf("channelenv: channel %s: event %q: %d of %d deliveries: %w", c.stream, eventID, len(got), n, context.Cause(ctx))
		}
	}
}

// record adds a to the attempts of the event with ID eventID.
func (c *Channel) record(eventID string, a Attempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := append(c.attempts[eventID], a)
	slices.SortStableFunc(all, func(x, y Attempt) int { return x.Time.Compare(y.Time) })
	c.attempts[eventID] = all
	close(c.changed)
	c.changed = make(chan struct{})
}

// ingress takes one CloudEvent per POST and stores it in the stream.
func (c *Channel) ingress(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a CloudEvent", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxEventBytes))
	if err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("body over %d bytes", MaxEventBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	ev, err := binding.ToEvent(r.Context(), cehttp.NewMessage(r.Header, io.NopCloser(bytes.NewReader(body))))
	if err == nil {
		err = ev.Validate()
	}
	if err != nil {
		http.Error(w, "not a CloudEvent: "+err.Error(), http.StatusBadRequest)
		return
	}
	data, err := json.Marshal(ev)
	if err != nil {
		http.Error(w, "encode event: "+err.Error(), http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), publishTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: c.subject, Data: data, Header: nats.Header{"Content-Type": []string{structuredContentType}}}
	if _, err := c.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID())); err != nil {
		http.Error(w, fmt.Sprintf("publish to stream %s: %v", c.stream, err), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// fetchLoop pulls messages until ctx ends and dispatches each in a goroutine
// of its own, tracked by wg.
func (c *Channel) fetchLoop(ctx context.Context, consumer jetstream.Consumer, wg *sync.WaitGroup) {
	for ctx.Err() == nil {
		batch, err := consumer.Fetch(FetchBatch, jetstream.FetchMaxWait(FetchMaxWait))
		if err != nil {
			if ctx.Err() == nil {
				c.logf("channelenv: channel %s: fetch: %v", c.stream, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(FetchMaxWait):
			}
			continue
		}
		for msg := range batch.Messages() {
			wg.Go(func() { c.dispatch(ctx, msg) })
		}
	}
}

// response is what one request got.
type response struct {
	status int
	body   []byte
	event  *event.Event // the event in a 2xx response, if any
	err    error        // no answer (status 0), or the failure status
}

// failed reports whether the request did not get a 2xx.
func (r response) failed() bool { return r.err != nil }

// dispatch delivers one message to the subscriber and settles it.
func (c *Channel) dispatch(ctx context.Context, msg jetstream.Msg) {
	ackWait := c.delivery.AckWait()
	ctx, cancel := context.WithTimeout(ctx, ackWait)
	defer cancel()

	ev := event.New()
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		// As eventing-natss does with a message it cannot read: leave it
		// unsettled, for JetStream to deliver again after AckWait.
		c.logf("channelenv: channel %s: message is not a structured CloudEvent: %v", c.stream, err)
		return
	}
	n := 1
	if md, err := msg.Metadata(); err == nil {
		n = int(md.NumDelivered)
	} else {
		c.logf("channelenv: channel %s: event %q: no metadata, taking delivery 1: %v", c.stream, ev.ID(), err)
	}
	lastTry := n > c.delivery.Retry

	a := Attempt{Time: time.Now(), N: n}
	resp := c.send(ctx, c.opts.Subscriber, ev, c.delivery.RequestTimeout(n), true)
	a.Status = resp.status
	if resp.status == 0 {
		a.Err = resp.err
	}
	switch {
	case !resp.failed():
		a.Result = Ack
		a.AckErr = msg.Ack()
	case retryable(resp.status):
		a.Result = Nak
		a.Delay = c.delivery.Backoff(n)
		a.AckErr = msg.NakWithDelay(a.Delay)
	default:
		a.Result = Term
		a.AckErr = msg.Term()
	}
	if a.AckErr != nil {
		a.AckErr = fmt.Errorf("channelenv: channel %s: event %q: %s delivery %d: %w", c.stream, ev.ID(), a.Result, n, a.AckErr)
	}

	switch {
	case resp.failed() && lastTry && c.opts.DeadLetter != "":
		a.DeadLetter, _ = c.forward(ctx, c.opts.DeadLetter, withErrorExtensions(ev, c.opts.Subscriber, resp))
	case !resp.failed() && resp.event != nil && c.opts.Reply != "":
		var replyResp response
		a.Reply, replyResp = c.forward(ctx, c.opts.Reply, *resp.event)
		if replyResp.failed() && c.opts.DeadLetter != "" {
			a.DeadLetter, _ = c.forward(ctx, c.opts.DeadLetter, withErrorExtensions(ev, c.opts.Reply, replyResp))
		}
	}
	c.record(ev.ID(), a)
}

// forward sends ev to target within Delivery.Timeout (and the message's
// AckWait, as eventing-natss does) and reports how it went.
func (c *Channel) forward(ctx context.Context, target string, ev event.Event) (*Forward, response) {
	r := c.send(ctx, target, ev, c.delivery.Timeout, false)
	return &Forward{URL: target, Status: r.status, Err: r.err}, r
}

// retryable reports whether a delivery answered with status (0: no answer)
// is delivered again: 5xx, 429, 408, or no answer (Knative counts that as
// 500).
func retryable(status int) bool {
	return status == 0 || status/100 == 5 || status == http.StatusTooManyRequests || status == http.StatusRequestTimeout
}

// send POSTs ev in binary mode to target within timeout, with "Prefer:
// reply" if preferReply, and reads the answer.
func (c *Channel) send(ctx context.Context, target string, ev event.Event, timeout time.Duration, preferReply bool) response {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
	if err != nil {
		return response{err: fmt.Errorf("request to %s: %w", target, err)}
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ev), req); err != nil {
		return response{err: fmt.Errorf("encode event %q for %s: %w", ev.ID(), target, err)}
	}
	if preferReply {
		req.Header.Set("Prefer", "reply")
	}
	res, err := c.client.Do(req)
	if err != nil {
		return response{err: fmt.Errorf("POST %s: %w", target, err)}
	}
	defer res.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes))
	r := response{status: res.StatusCode, body: body}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		r.err = fmt.Errorf("POST %s: unexpected HTTP response, expected 2xx, got %d", target, res.StatusCode)
		return r
	}
	if readErr != nil {
		return r // the delivery succeeded; its response event is lost
	}
	m := cehttp.NewMessage(res.Header, io.NopCloser(bytes.NewReader(body)))
	if m.ReadEncoding() == binding.EncodingUnknown {
		return r
	}
	if reply, err := binding.ToEvent(ctx, m); err == nil {
		r.event = reply
	} else {
		c.logf("channelenv: channel %s: event %q: response from %s is no CloudEvent: %v", c.stream, ev.ID(), target, err)
	}
	return r
}

// withErrorExtensions returns a copy of ev carrying the knativeerror*
// extensions for the failed request to dest that got r.
func withErrorExtensions(ev event.Event, dest string, r response) event.Event {
	code, body := r.status, r.body
	if code == 0 {
		code = http.StatusInternalServerError
		body = []byte("dispatch error: " + r.err.Error())
	}
	data := base64.StdEncoding.EncodeToString(body)
	if len(data) > ErrorDataMax {
		data = data[:ErrorDataMax]
	}
	out := ev.Clone()
	out.SetExtension(ErrorDestExtension, dest)
	out.SetExtension(ErrorCodeExtension, strconv.Itoa(code))
	out.SetExtension(ErrorDataExtension, data)
	return out
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b)
}
