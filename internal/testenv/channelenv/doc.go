// Package channelenv runs, for tests, a stand-in for eventing-natss's
// NatsJetStreamChannel dispatcher, written from its documented and observed
// behaviour (eventing-natss pkg/channel/jetstream/dispatcher:
// message_dispatcher.go, defaults.go, utils/consumerconfig.go); not Knative's
// code. No Knative module is built or imported: the harness plays the
// channel's delivery contract against a real nats-server (see
// jetstreamenv.Start) so that the handle side (shared/trigger/push.Assignments) can be
// tested against what deploy/knative/10-channel.yaml ships.
//
// A Channel is three parts, as the real one is:
//
//   - Ingress: an HTTP server on 127.0.0.1 (Channel.URL) that takes one
//     CloudEvent per POST (binary or structured mode, at most MaxEventBytes)
//     and stores it in the channel's stream, with the event ID as its
//     Nats-Msg-Id, as a structured-mode (JSON) CloudEvent. It answers 202 once
//     JetStream has stored the event (or recognised it as a duplicate within
//     DuplicateWindow), 400 for a request that is not a valid CloudEvent, 413
//     for one over the cap and 500 if the publish failed.
//   - Stream: Limits retention, file storage, DuplicateWindow.
//   - Dispatcher: one durable pull consumer (explicit acks, AckWait =
//     Delivery.AckWait, MaxDeliver = Delivery.MaxDeliver, MaxAckPending from
//     Options) and one goroutine per fetched message, which POSTs the event in
//     binary mode with "Prefer: reply" to the subscriber and then: on 2xx
//     acks (and forwards a response event to the reply URL); on 5xx, 429, 408
//     or no answer naks with Delivery.Backoff(n) as delay; on any other status
//     terminates. When a failed delivery was the last try (n > Retry), the
//     original event goes to the dead-letter URL with the knativeerror*
//     extensions (ErrorCodeExtension, ...), after the nak or term.
//
// Every delivery is recorded (Channel.Deliveries, Channel.WaitDeliveries).
// Everything a Channel starts ends in the test's Cleanup. Durations are real:
// tests that need a short run choose a small Delivery; tests of the product
// pass the shipped one (LoadDelivery), never numbers of their own.
//
// Left out of the real channel: one Subscription per Channel (no fan-out, no
// channel-level delivery); the reply and dead-letter sends are one request
// each (eventing-natss retries them with the subscription's retry settings);
// no push consumer and no consumerConfigTemplate beyond what the Delivery and
// Options give; no stream limits (maxAge, ...); no tracing, OIDC or
// passed-through response headers; a stored message that is not a CloudEvent
// is left unsettled, as eventing-natss leaves it, for JetStream to redeliver.
package channelenv
