package metrics

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/poolstatus"
)

// ConsumerInfo reads one durable consumer's state from JetStream (one
// CONSUMER.INFO request: jetstream.JetStream.Consumer, then CachedInfo).
type ConsumerInfo func(ctx context.Context, stream, consumer string) (*jetstream.ConsumerInfo, error)

// Consumers is a collector that reads each durable consumer's state on
// scrape: what KEDA scales on (pending + ack pending) and redeliveries.
// Nothing is cached: a scrape sees JetStream's state at that moment.
type Consumers struct {
	info      ConsumerInfo
	stream    string
	consumers []string
	log       *slog.Logger

	pending, ackPending, redelivered, waiting, up *prometheus.Desc
}

// NewConsumers returns the collector of stream's durable consumers (one per
// backend); register it with a Registry.
func NewConsumers(info ConsumerInfo, stream string, consumers []string, log *slog.Logger) *Consumers {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "consumer", name), help, []string{"stream", "consumer"}, nil)
	}
	return &Consumers{info: info, stream: stream, consumers: consumers, log: log,
		pending:     desc("pending_messages", "Messages of the consumer not yet delivered (JetStream num_pending)."),
		ackPending:  desc("ack_pending_messages", "Messages delivered and not yet acknowledged (num_ack_pending): assignments a handler holds."),
		redelivered: desc("redelivered_messages", "Messages delivered more than once and not yet acknowledged (num_redelivered)."),
		waiting:     desc("waiting_pulls", "Pull requests waiting for a message (num_waiting)."),
		up:          desc("info_up", "1 when the consumer's state could be read at this scrape, 0 otherwise."),
	}
}

// Describe implements prometheus.Collector.
func (c *Consumers) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.ackPending, c.redelivered, c.waiting, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one info request per consumer,
// within ScrapeTimeout in all.
func (c *Consumers) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	for _, name := range c.consumers {
		info, err := c.info(ctx, c.stream, name)
		if err != nil {
			if c.log != nil {
				c.log.Debug("consumer state unreadable for metrics (gdr_consumer_info_up 0)", slog.String("stream", c.stream), slog.String("consumer", name), slog.Any("error", err))
			}
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0, c.stream, name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1, c.stream, name)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(info.NumPending), c.stream, name)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(info.NumAckPending), c.stream, name)
		ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, float64(info.NumRedelivered), c.stream, name)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(info.NumWaiting), c.stream, name)
	}
}

// Backlogs is what poolstatus reads of each consumer, through info.
func (info ConsumerInfo) Backlogs() poolstatus.Backlogs {
	return func(ctx context.Context, stream, consumer string) (poolstatus.Backlog, error) {
		i, err := info(ctx, stream, consumer)
		if err != nil {
			return poolstatus.Backlog{}, err
		}
		return poolstatus.Backlog{Pending: i.NumPending, AckPending: uint64(max(i.NumAckPending, 0))}, nil
	}
}

// JetStreamConsumerInfo is the ConsumerInfo of js.
func JetStreamConsumerInfo(js jetstream.JetStream) ConsumerInfo {
	return func(ctx context.Context, stream, consumer string) (*jetstream.ConsumerInfo, error) {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return nil, err
		}
		return c.CachedInfo(), nil
	}
}
