package channelenv

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"
)

// Backoff policies, as a Subscription's spec.delivery.backoffPolicy spells
// them.
const (
	BackoffLinear      = "linear"
	BackoffExponential = "exponential"
)

const (
	// AckWaitJitter is what the dispatcher adds to delivery.timeout to get
	// the consumer's AckWait, so that it gives up on a request before
	// JetStream redelivers the message.
	AckWaitJitter = 500 * time.Millisecond
	// RequestTimeoutJitter is what the dispatcher takes off AckWait to get a
	// request's timeout.
	RequestTimeoutJitter = 200 * time.Millisecond
)

// Delivery is a Subscription's spec.delivery: how often, how patiently and
// how long apart the channel's dispatcher delivers an event to the
// subscriber. The harness derives the JetStream consumer from it as
// eventing-natss does (AckWait, MaxDeliver) and the request timeout and nak
// delay of each delivery (RequestTimeout, Backoff).
type Delivery struct {
	// Retry is how many times a failed delivery is tried again: a message is
	// delivered at most Retry+1 times.
	Retry int
	// BackoffPolicy is BackoffLinear or BackoffExponential; it may be empty
	// only when Retry is 0 (no delay ever follows a nak then).
	BackoffPolicy string
	// BackoffDelay is the unit of the backoff.
	BackoffDelay time.Duration
	// Timeout is the subscriber's time to answer one delivery; it must be
	// positive (the harness, like the shipped channel, takes AckWait from it).
	Timeout time.Duration
}

// Validate reports the first field of d the dispatcher cannot work with,
// named as in a manifest (delivery.retry, ...).
func (d Delivery) Validate() error {
	switch {
	case d.Retry < 0:
		return fmt.Errorf("delivery.retry is %d: want 0 or more", d.Retry)
	case d.BackoffPolicy == "" && d.Retry > 0:
		return fmt.Errorf("delivery.backoffPolicy is empty with delivery.retry %d: want %s or %s", d.Retry, BackoffLinear, BackoffExponential)
	case d.BackoffPolicy != "" && d.BackoffPolicy != BackoffLinear && d.BackoffPolicy != BackoffExponential:
		return fmt.Errorf("delivery.backoffPolicy is %q: want %s or %s", d.BackoffPolicy, BackoffLinear, BackoffExponential)
	case d.BackoffDelay < 0:
		return fmt.Errorf("delivery.backoffDelay is %v: want 0 or more", d.BackoffDelay)
	case d.Timeout <= 0:
		return fmt.Errorf("delivery.timeout is %v: want a positive duration (AckWait is derived from it)", d.Timeout)
	}
	return nil
}

// AckWait is the consumer's AckWait: Timeout + AckWaitJitter.
func (d Delivery) AckWait() time.Duration { return d.Timeout + AckWaitJitter }

// MaxDeliver is the consumer's MaxDeliver: Retry + 1.
func (d Delivery) MaxDeliver() int { return d.Retry + 1 }

// RequestTimeout is the timeout of the request of delivery n (JetStream's
// NumDelivered, from 1): min(AckWait, n*AckWait) - RequestTimeoutJitter.
func (d Delivery) RequestTimeout(n int) time.Duration {
	ackWait := d.AckWait()
	return min(ackWait, time.Duration(max(n, 0))*ackWait) - RequestTimeoutJitter
}

// Backoff is the delay of the nak after failed delivery n: BackoffDelay*n
// (linear) or BackoffDelay*2^n (exponential), saturating at the largest
// time.Duration; 0 without a policy.
func (d Delivery) Backoff(n int) time.Duration {
	var factor float64
	switch d.BackoffPolicy {
	case BackoffLinear:
		factor = float64(n)
	case BackoffExponential:
		factor = math.Exp2(float64(n))
	default:
		return 0
	}
	f := float64(d.BackoffDelay) * factor
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(f)
}

// Span is the time a message that fails every delivery with a retryable
// status (5xx, 429, 408, no answer) spends in backoff before it is given up
// (and dead-lettered): the sum of Backoff(n) over the deliveries 1..Retry
// that are followed by another. It leaves out the time the subscriber takes
// to answer.
func (d Delivery) Span() time.Duration {
	var sum time.Duration
	for n := 1; n <= d.Retry; n++ {
		b := d.Backoff(n)
		if b > math.MaxInt64-sum {
			return math.MaxInt64
		}
		sum += b
	}
	return sum
}

// LoadDelivery reads the multi-document YAML manifest at path and returns
// the spec.delivery of the Subscription named subscription, validated
// (Delivery.Validate). Durations are ISO-8601 (ParseISODuration). It fails
// when the file holds no such Subscription, holds two, or the Subscription
// has no spec.delivery; its errors name the file, the Subscription and the
// field.
func LoadDelivery(path, subscription string) (Delivery, error) {
	f, err := os.Open(path)
	if err != nil {
		return Delivery{}, fmt.Errorf("channelenv: load delivery: %w", err)
	}
	defer f.Close()

	type deliverySpec struct {
		Retry         *int   `yaml:"retry"`
		BackoffPolicy string `yaml:"backoffPolicy"`
		BackoffDelay  string `yaml:"backoffDelay"`
		Timeout       string `yaml:"timeout"`
	}
	type document struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			Delivery *deliverySpec `yaml:"delivery"`
		} `yaml:"spec"`
	}
	var found *deliverySpec
	matches := 0
	dec := yaml.NewDecoder(f)
	for i := 1; ; i++ {
		var doc document
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Delivery{}, fmt.Errorf("channelenv: %s: document %d: %w", path, i, err)
		}
		if doc.Kind != "Subscription" || doc.Metadata.Name != subscription {
			continue
		}
		matches++
		found = doc.Spec.Delivery
	}
	where := fmt.Sprintf("channelenv: %s: Subscription %q", path, subscription)
	switch {
	case matches == 0:
		return Delivery{}, fmt.Errorf("%s: not found", where)
	case matches > 1:
		return Delivery{}, fmt.Errorf("%s: found %d times", where, matches)
	case found == nil:
		return Delivery{}, fmt.Errorf("%s: has no spec.delivery", where)
	}

	var d Delivery
	if found.Retry != nil {
		d.Retry = *found.Retry
	}
	d.BackoffPolicy = found.BackoffPolicy
	for _, field := range []struct {
		name  string
		value string
		into  *time.Duration
	}{
		{"backoffDelay", found.BackoffDelay, &d.BackoffDelay},
		{"timeout", found.Timeout, &d.Timeout},
	} {
		if field.value == "" {
			continue
		}
		v, err := ParseISODuration(field.value)
		if err != nil {
			return Delivery{}, fmt.Errorf("%s: spec.delivery.%s: %w", where, field.name, err)
		}
		*field.into = v
	}
	if err := d.Validate(); err != nil {
		return Delivery{}, fmt.Errorf("%s: spec.%w", where, err)
	}
	return d, nil
}

// ParseISODuration parses the time part of an ISO-8601 duration, the subset
// Knative's delivery durations use: "PT" followed by one or more of hours
// (H), minutes (M) and seconds (S), in that order, each a decimal number;
// only the last may have a fraction ("PT1M30S", "PT0.25S", "PT1.5H"). The
// result is truncated to the nanosecond. Date parts (years, months, weeks,
// days), signs and anything else are an error.
func ParseISODuration(s string) (time.Duration, error) {
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("%q is not an ISO-8601 duration of the form PTnHnMnS: %s", s, why)
	}
	rest, ok := strings.CutPrefix(s, "PT")
	switch {
	case !ok && strings.HasPrefix(s, "P"):
		return bad("date parts (Y, M, W, D) are not supported")
	case !ok:
		return bad(`it does not start with "PT"`)
	case rest == "":
		return bad(`nothing follows "PT"`)
	}
	units := []struct {
		designator byte
		unit       time.Duration
	}{{'H', time.Hour}, {'M', time.Minute}, {'S', time.Second}}
	total := new(big.Rat)
	next := 0 // index in units of the first designator still allowed
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		number := rest[:i]
		if i == len(rest) {
			return bad(fmt.Sprintf("number %q has no unit", number))
		}
		designator := rest[i]
		rest = rest[i+1:]
		u := next
		for u < len(units) && units[u].designator != designator {
			u++
		}
		if u == len(units) {
			return bad(fmt.Sprintf("unit %q is not H, M or S, or is out of order or repeated", designator))
		}
		next = u + 1
		whole, frac, hasFrac := strings.Cut(number, ".")
		if !digits(whole) || hasFrac && !digits(frac) {
			return bad(fmt.Sprintf("%q is not a decimal number", number))
		}
		if hasFrac && rest != "" {
			return bad("only the last part may have a fraction")
		}
		v, ok := new(big.Rat).SetString(number)
		if !ok {
			return bad(fmt.Sprintf("%q is not a decimal number", number))
		}
		total.Add(total, v.Mul(v, new(big.Rat).SetInt64(int64(units[u].unit))))
	}
	ns := new(big.Int).Quo(total.Num(), total.Denom())
	if !ns.IsInt64() {
		return bad("it is longer than the longest time.Duration")
	}
	return time.Duration(ns.Int64()), nil
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
