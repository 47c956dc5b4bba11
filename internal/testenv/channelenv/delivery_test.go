package channelenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// shippedManifest is the channel and Subscription deploy/knative ships.
const shippedManifest = "../../../deploy/knative/10-channel.yaml"

func TestParseISODuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"PT1S", time.Second},
		{"PT30S", 30 * time.Second},
		{"PT0.1S", 100 * time.Millisecond},
		{"PT0.25S", 250 * time.Millisecond},
		{"PT1M30S", 90 * time.Second},
		{"PT2H", 2 * time.Hour},
		{"PT1H2M3S", time.Hour + 2*time.Minute + 3*time.Second},
		{"PT1.5H", 90 * time.Minute},
		{"PT0S", 0},
		{"PT0.000000001S", time.Nanosecond},
		{"PT0.0000000019S", time.Nanosecond}, // truncated
	} {
		got, err := ParseISODuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseISODuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		"", "1s", "30s", "PT", "P1D", "P1DT1S", "PT1D", "PT-1S", "PT+1S", "pt1s", "PT1s",
		"PT1", "PTS", "PT.5S", "PT1.S", "PT1S1M", "PT1S1S", "PT1.5M30S", "PT1,5S", "PT 1S", "PT1S ",
		"PT9999999999999H",
	} {
		if got, err := ParseISODuration(in); err == nil {
			t.Errorf("ParseISODuration(%q) = %v, want an error", in, got)
		} else if !strings.Contains(err.Error(), "PTnHnMnS") {
			t.Errorf("ParseISODuration(%q) error %q does not say which form is wanted", in, err)
		}
	}
}

func TestDeliveryDerivedNumbers(t *testing.T) {
	shipped := Delivery{Retry: 4, BackoffPolicy: BackoffExponential, BackoffDelay: time.Second, Timeout: 30 * time.Second}
	if got, want := shipped.AckWait(), 30500*time.Millisecond; got != want {
		t.Errorf("AckWait = %v, want %v", got, want)
	}
	if got := shipped.MaxDeliver(); got != 5 {
		t.Errorf("MaxDeliver = %d, want 5", got)
	}
	for n, want := range map[int]time.Duration{1: 30300 * time.Millisecond, 3: 30300 * time.Millisecond} {
		if got := shipped.RequestTimeout(n); got != want {
			t.Errorf("RequestTimeout(%d) = %v, want %v", n, got, want)
		}
	}
	for n, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 4: 16 * time.Second} {
		if got := shipped.Backoff(n); got != want {
			t.Errorf("exponential Backoff(%d) = %v, want %v", n, got, want)
		}
	}
	if got, want := shipped.Span(), 30*time.Second; got != want { // 2+4+8+16
		t.Errorf("exponential Span = %v, want %v", got, want)
	}

	linear := Delivery{Retry: 3, BackoffPolicy: BackoffLinear, BackoffDelay: 100 * time.Millisecond, Timeout: time.Second}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 3: 300 * time.Millisecond} {
		if got := linear.Backoff(n); got != want {
			t.Errorf("linear Backoff(%d) = %v, want %v", n, got, want)
		}
	}
	if got, want := linear.Span(), 600*time.Millisecond; got != want { // 100+200+300
		t.Errorf("linear Span = %v, want %v", got, want)
	}
	if got := (Delivery{BackoffPolicy: BackoffLinear, BackoffDelay: time.Second, Timeout: time.Second}).Span(); got != 0 {
		t.Errorf("Span without retries = %v, want 0", got)
	}
	if got := (Delivery{Retry: 100, BackoffPolicy: BackoffExponential, BackoffDelay: time.Hour}).Span(); got <= 0 {
		t.Errorf("Span of a huge exponential backoff = %v, want it to saturate, not overflow", got)
	}
}

func TestLoadDeliveryShippedSubscription(t *testing.T) {
	d, err := LoadDelivery(shippedManifest, "handle-pod")
	if err != nil {
		t.Fatal(err)
	}
	// The numbers are deploy's to choose; whatever they are, the harness can
	// run them.
	if err := d.Validate(); err != nil {
		t.Fatalf("shipped delivery %+v: %v", d, err)
	}
	if d.Timeout <= 0 || d.BackoffPolicy == "" {
		t.Fatalf("shipped delivery %+v lacks a timeout or a backoff policy", d)
	}
	t.Logf("shipped delivery %+v: AckWait %v, MaxDeliver %d, %v in backoff before a message is given up",
		d, d.AckWait(), d.MaxDeliver(), d.Span())
	if _, err := LoadDelivery(shippedManifest, "no-such-subscription"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("LoadDelivery of a missing Subscription: err = %v, want not found", err)
	}
}

// manifest is a channel and its Subscription with the given delivery body
// (YAML lines indented under spec.delivery), the channel's own delivery
// differing, so that a reader of the wrong document gets other numbers.
func manifest(delivery string) string {
	return `apiVersion: messaging.knative.dev/v1alpha1
kind: NatsJetStreamChannel
metadata:
  name: ch
spec:
  delivery:
    retry: 9
    backoffPolicy: linear
    backoffDelay: PT9S
    timeout: PT9S
---
# a comment document separator follows
apiVersion: messaging.knative.dev/v1
kind: Subscription
metadata:
  name: other
spec:
  delivery:
    retry: 7
    backoffPolicy: linear
    backoffDelay: PT7S
    timeout: PT7S
---
apiVersion: messaging.knative.dev/v1
kind: Subscription
metadata:
  name: sub
spec:
  channel:
    name: ch
` + delivery
}

func writeManifest(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "channel.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadDeliveryPicksTheNamedSubscription(t *testing.T) {
	path := writeManifest(t, manifest(`  delivery:
    retry: 2
    backoffPolicy: exponential
    backoffDelay: PT0.5S
    timeout: PT1M30S
`))
	got, err := LoadDelivery(path, "sub")
	if err != nil {
		t.Fatal(err)
	}
	want := Delivery{Retry: 2, BackoffPolicy: BackoffExponential, BackoffDelay: 500 * time.Millisecond, Timeout: 90 * time.Second}
	if got != want {
		t.Fatalf("LoadDelivery = %+v, want %+v", got, want)
	}
}

func TestLoadDeliveryRejects(t *testing.T) {
	const good = "    retry: 2\n    backoffPolicy: linear\n    backoffDelay: PT1S\n    timeout: PT30S\n"
	for _, tc := range []struct {
		name    string
		content string
		want    string // in the error
	}{
		{"backoffDelay in Go syntax", manifest("  delivery:\n    retry: 2\n    backoffPolicy: linear\n    backoffDelay: 1s\n    timeout: PT30S\n"),
			`Subscription "sub": spec.delivery.backoffDelay: "1s" is not an ISO-8601 duration`},
		{"timeout in days", manifest("  delivery:\n    retry: 2\n    backoffPolicy: linear\n    backoffDelay: PT1S\n    timeout: P1D\n"),
			`spec.delivery.timeout: "P1D"`},
		{"timeout a number", manifest("  delivery:\n    retry: 2\n    backoffPolicy: linear\n    backoffDelay: PT1S\n    timeout: 30\n"),
			`spec.delivery.timeout: "30"`},
		{"no timeout", manifest("  delivery:\n    retry: 2\n    backoffPolicy: linear\n    backoffDelay: PT1S\n"),
			"spec.delivery.timeout"},
		{"unknown policy", manifest("  delivery:\n    retry: 2\n    backoffPolicy: fibonacci\n    backoffDelay: PT1S\n    timeout: PT30S\n"),
			`spec.delivery.backoffPolicy is "fibonacci"`},
		{"negative retry", manifest("  delivery:\n    retry: -1\n    backoffPolicy: linear\n    backoffDelay: PT1S\n    timeout: PT30S\n"),
			"spec.delivery.retry is -1"},
		{"no delivery", manifest(""), `Subscription "sub": has no spec.delivery`},
		{"two of the name", manifest("  delivery:\n"+good) + "---\n" + strings.SplitN(manifest("  delivery:\n"+good), "---\n", 3)[2],
			`Subscription "sub": found 2 times`},
		{"not YAML", "kind: [", "document 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeManifest(t, tc.content)
			d, err := LoadDelivery(path, "sub")
			if err == nil {
				t.Fatalf("LoadDelivery = %+v, want an error containing %q", d, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("LoadDelivery error %q, want it to name %s and contain %q", err, path, tc.want)
			}
		})
	}
}
