// Command fetchack is the reference of handle's cold-start benchmark (test
// only, no product function): the least a one-shot JetStream handler does.
// It connects as handle does (natsconn, GDR_NATS_URL), binds the durable
// consumer GDR_BACKEND of stream GDR_STREAM (default CI_RUNNER), fetches
// one message, acks it, flushes and exits: 0 once a message was acked, 1
// otherwise.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/natsconn"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fetchack:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	stream, backend := os.Getenv("GDR_STREAM"), os.Getenv("GDR_BACKEND")
	if stream == "" {
		stream = "CI_RUNNER"
	}
	nc, js, err := natsconn.Connect(ctx, natsconn.ConnSettings{URL: os.Getenv("GDR_NATS_URL")}, "handle-"+backend)
	if err != nil {
		return err
	}
	c, err := js.Consumer(ctx, stream, backend)
	if err != nil {
		nc.Close()
		return fmt.Errorf("stream %q: consumer %q: %w", stream, backend, err)
	}
	msgs, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		nc.Close()
		return fmt.Errorf("consumer %q: fetch: %w", backend, err)
	}
	acked := 0
	for m := range msgs.Messages() {
		if err := m.Ack(); err != nil {
			nc.Close()
			return fmt.Errorf("consumer %q: ack: %w", backend, err)
		}
		acked++
	}
	if err := natsconn.Close(nc); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if acked == 0 {
		return fmt.Errorf("consumer %q: no message (%v)", backend, msgs.Error())
	}
	return nil
}
