package pull

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler/handlertest"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// Acks are confirmed side by side: the next message of a batch is offered
// while the server's answer to the last ack is on its way, a message counts
// Accepted only once its ack is confirmed, one whose confirmation is lost
// counts Failed (and stays in the stream), and Run returns only once every
// answer came.
func TestJobConfirmsAcksSideBySide(t *testing.T) {
	q, c, _ := queue(t, 10)
	for id := int64(1); id <= 3; id++ {
		publish(t, q, handlertest.Assignment(t, id))
	}
	secondAccepted := make(chan struct{})
	acceptor := handlertest.AcceptFunc(func(_ context.Context, a taskassignment.Assignment) (bool, error) {
		if a.Task.ID == 2 {
			close(secondAccepted)
		}
		return true, nil
	})
	var firstConfirmed time.Time
	gates := map[int]func(context.Context) error{
		// The first ack's answer comes only once the second message was
		// accepted: a loop that waited for it would give up after its
		// ack timeout.
		0: func(ctx context.Context) error {
			select {
			case <-secondAccepted:
				time.Sleep(50 * time.Millisecond) // Run must wait for this answer
				firstConfirmed = time.Now()
				return nil
			case <-ctx.Done():
				return errors.New("the second message waited for the first one's confirmation")
			}
		},
		1: func(context.Context) error { return errors.New("confirmation lost") },
	}
	var log logBuffer
	j := job(gatedConsumer{Consumer: c, gates: gates}, acceptor, &log)
	j.Batch = 3
	sum, err := j.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if firstConfirmed.IsZero() {
		t.Fatalf("Run returned before the first ack's answer; log:\n%s", log.String())
	}
	if sum != (Summary{Fetched: 3, Accepted: 2, Failed: 1}) {
		t.Fatalf("summary = %+v; log:\n%s", sum, log.String())
	}
	if got := strings.Count(log.String(), "assignment accepted, acknowledgement not confirmed"); got != 1 {
		t.Fatalf("%d unconfirmed acks logged, want 1; log:\n%s", got, log.String())
	}
	expectOutstanding(t, q, 1) // the one whose confirmation was lost was never acked here
}

// gatedConsumer wraps the messages it fetches so that the DoubleAck of the
// i-th one (from 0, over the consumer's life) runs gates[i] first, and only
// then, if it returned nil, the real DoubleAck.
type gatedConsumer struct {
	jetstream.Consumer
	gates map[int]func(context.Context) error

	mu *sync.Mutex
	n  *int
}

func (g gatedConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	if g.mu == nil {
		g.mu, g.n = &sync.Mutex{}, new(int)
	}
	b, err := g.Consumer.Fetch(batch, opts...)
	if err != nil {
		return nil, err
	}
	out := make(chan jetstream.Msg)
	go func() {
		defer close(out)
		for m := range b.Messages() {
			g.mu.Lock()
			i := *g.n
			*g.n++
			g.mu.Unlock()
			out <- gatedMsg{Msg: m, gate: g.gates[i]}
		}
	}()
	return gatedBatch{MessageBatch: b, msgs: out}, nil
}

type gatedBatch struct {
	jetstream.MessageBatch
	msgs <-chan jetstream.Msg
}

func (b gatedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type gatedMsg struct {
	jetstream.Msg
	gate func(context.Context) error
}

func (m gatedMsg) DoubleAck(ctx context.Context) error {
	if m.gate != nil {
		if err := m.gate(ctx); err != nil {
			return err
		}
	}
	return m.Msg.DoubleAck(ctx)
}
