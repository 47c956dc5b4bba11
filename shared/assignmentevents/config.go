package assignmentevents

import (
	"fmt"
	"net/url"
)

// The values of GDR_PUBLISH.
const (
	PublishJetStream   = "jetstream"
	PublishCloudEvents = "cloudevents"
)

// PublishSettings is where dispatch and recover send assignments, embedded in
// their configurations: the JetStream queue (KEDA) or a CloudEvents sink
// (Knative). Call Check with the value of K_SINK.
type PublishSettings struct {
	Publish   string `envconfig:"GDR_PUBLISH" default:"jetstream" desc:"where assignments go: jetstream (the queue stream GDR_STREAM; KEDA) or cloudevents (the CloudEvents sink GDR_EVENT_SINK: a NatsJetStreamChannel or a Broker; Knative)"`
	EventSink string `envconfig:"GDR_EVENT_SINK" desc:"cloudevents: the sink's URL; empty: K_SINK, which a Knative SinkBinding injects"`
}

// Check refuses an unknown GDR_PUBLISH, and in cloudevents mode a sink that
// is missing or not an http(s) URL; kSink is the value of K_SINK, the sink
// when GDR_EVENT_SINK is empty. Its errors name the variable, never a URL's
// credentials.
func (p *PublishSettings) Check(kSink string) error {
	switch p.Publish {
	case PublishJetStream:
		return nil
	case PublishCloudEvents:
	default:
		return fmt.Errorf("GDR_PUBLISH %q: want %s or %s", p.Publish, PublishJetStream, PublishCloudEvents)
	}
	name := "GDR_EVENT_SINK"
	if p.EventSink == "" {
		p.EventSink, name = kSink, "K_SINK"
	}
	if p.EventSink == "" {
		return fmt.Errorf("GDR_PUBLISH=%s needs GDR_EVENT_SINK or K_SINK (a Knative SinkBinding sets it)", PublishCloudEvents)
	}
	u, err := url.Parse(p.EventSink)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s: not an http(s) URL", name)
	}
	return nil
}

// CloudEvents reports whether assignments go to a CloudEvents sink.
func (p PublishSettings) CloudEvents() bool { return p.Publish == PublishCloudEvents }
