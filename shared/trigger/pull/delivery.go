package pull

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Puller is the part of a jetstream.Consumer an adapter pulls its messages
// with.
type Puller interface {
	Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error)
}

// Count is msg's delivery count: 1 on its first delivery, and 1 when its
// metadata does not parse (a message that cannot say how often it came is
// never taken for one on its last delivery).
func Count(msg jetstream.Msg) uint64 {
	if md, err := msg.Metadata(); err == nil {
		return md.NumDelivered
	}
	return 1
}

// Retry is how an adapter gives back a message it could not finish: handed
// back to come again after a delay or, on its last delivery, terminated with
// a reason. A work-queue message handed back on its last delivery would stay
// in its stream, delivered never again and counted as pending for ever;
// terminated, it leaves the stream and its reason reaches whoever captures
// the advisory.
//
// Retry hands msg back to come again after delay (at once when delay is not
// positive) or, when this is its last delivery (Count(msg) >= maxDeliver, the
// consumer's MaxDeliver), terminates it with reason instead; terminated says
// which. err is the failed nak or termination: a message whose nak failed
// comes back after its ack wait, one whose termination failed likewise, to
// be terminated on that delivery. maxDeliver below 1 means no limit.
func Retry(msg jetstream.Msg, delay time.Duration, maxDeliver int, reason string) (terminated bool, err error) {
	if maxDeliver > 0 && Count(msg) >= uint64(maxDeliver) {
		return true, msg.TermWithReason(reason)
	}
	if delay > 0 {
		return false, msg.NakWithDelay(delay)
	}
	return false, msg.Nak()
}
