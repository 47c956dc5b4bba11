package assignmentqueue

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"fmt"
	"slices"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DefaultPayloadBucket is the conventional name of the payload bucket.
const DefaultPayloadBucket = "CI_TASKS"

// PayloadMarkerTTL is how long a deleted payload is still counted by the
// gateway's scale signal (GatewayConsumer): Delete leaves a marker that
// expires after it, and so does a payload expiring at the bucket's TTL (the
// bucket's LimitMarkerTTL). One second is the least nats-server accepts. No
// reader depends on a marker: a key whose marker expired reads as one never
// written, as a deleted one does.
const PayloadMarkerTTL = time.Second

// GatewayConsumer is the gateway's scale signal: a durable consumer on the
// payload bucket's stream (KV_<bucket>, KV_CI_TASKS by default) that is never
// read; KEDA's nats-jetstream trigger reads its lag (num_pending +
// num_ack_pending, from nats-server's monitoring /jsz?consumers=true) and
// scales the gateway to zero when it is 0. It is filtered to the payload keys
// (one token, $KV.<bucket>.*: the started and sent marks, two tokens, are
// not counted), takes no acks and starts at the first message.
//
// The invariant the trigger relies on: num_pending is the number of payloads
// stored, one per task from dispatch's claim (Put) until recover cleaned it
// up (Delete), plus the payloads deleted or expired within the last
// PayloadMarkerTTL and the server's settle time (its expiry timer, about a
// second more); num_ack_pending is always 0. So it is 0 only when no task is
// in flight and has not been for about two seconds, when no executor can
// still need the gateway.
//
// Crash windows: a payload never deleted (no recover pass reached it) keeps
// the count above 0, and the gateway up, until the bucket's TTL (the longest
// job) expires it; a payload deleted by a store that opened a bucket still
// without marker TTLs (during an upgrade, before dispatch converged it) is
// counted until the bucket's TTL or until dispatch next starts
// (EnsurePayloads replaces such markers).
const GatewayConsumer = "gateway"

// gatewayConsumerConfig is what EnsurePayloads converges bucket's
// GatewayConsumer to. Its replica count is left unset, so it follows the
// bucket's (see placement.go); InactiveThreshold unset keeps it forever.
func gatewayConsumerConfig(bucket string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       GatewayConsumer,
		Description:   "the gateway's scale signal: never read; KEDA's nats-jetstream trigger reads its lag (payloads in flight)",
		FilterSubject: "$KV." + bucket + ".*",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckNonePolicy,
	}
}

const (
	// payloadKeySize is the AES-256 key size the store requires.
	payloadKeySize = 32
	// sealVersion is the first byte of every stored value: the layout
	// sealVersion | 12-byte nonce | AES-256-GCM ciphertext and tag, with the
	// assignment ID as additional data.
	sealVersion byte = 1
)

var (
	// ErrPayloadSealed means a stored value does not open to a task under
	// this store's keys for this assignment ID: another key sealed it, it was
	// altered, or it was sealed for another assignment ID. No part of such a
	// value is ever returned.
	ErrPayloadSealed = errors.New("task payload does not open")
)

// Payloads stores the whole task of each assignment in a JetStream key-value
// bucket, keyed by assignment ID and sealed with AES-256-GCM. A value is
// bound to its key: it opens only under the store key that sealed it and only
// for the assignment ID it was put under. A store seals with its current key
// alone and opens with it first, then with each of its old keys in order (a
// key rotation, GDR_PAYLOAD_OLD_KEYS: values sealed before it stay readable).
// Values expire after the bucket's TTL. Safe for concurrent use.
type Payloads struct {
	kv     jetstream.KeyValue
	bucket string
	// aead seals, under the current key; opens are tried in order: aead,
	// then one per old key.
	aead  cipher.AEAD
	opens []cipher.AEAD
}

// EnsurePayloads creates bucket b, or converges an existing one, to file
// storage, one revision per key, b's replica count (0 keeps an existing
// bucket's), reads answered by its leader alone (see placement.go) and
// deletion markers that expire after PayloadMarkerTTL, creates or converges
// its GatewayConsumer, and returns a store sealing values under key, which
// must be exactly 32 bytes, and opening them under key or any of old (each
// exactly 32 bytes too). b.TTL is the longest a job may run, after which a
// payload is useless, and must be positive. An existing bucket's TTL is never
// shrunk: the larger of the two is kept, so a process that knows fewer or
// shorter pools (an older configuration, `dispatch run -pool`) cannot expire
// payloads of running jobs early for everyone. Errors name the bucket, and an
// old key by its position, and never contain a key.
//
// The markers of payloads deleted before the bucket had marker TTLs (an
// earlier version's, kept until the bucket's TTL) are replaced by markers that
// expire, so that they stop counting; a marker whose key was written since is
// left alone. EnsurePayloads is idempotent, and safe to run from several
// processes at once: an existing GatewayConsumer with this configuration is
// left as it is, one with another is converged in place where nats-server
// allows, and reported otherwise.
func EnsurePayloads(ctx context.Context, js jetstream.JetStream, b Bucket, key secretkey.Key, old ...secretkey.Key) (*Payloads, error) {
	aead, opens, err := newAEADs(b.Name, key, old)
	if err != nil {
		return nil, err
	}
	kv, err := ensureBucket(ctx, js, b, "payload store", PayloadMarkerTTL)
	if err != nil {
		return nil, err
	}
	stream := "KV_" + b.Name
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, gatewayConsumerConfig(b.Name)); err != nil {
		return nil, fmt.Errorf("payload store %q: ensure consumer %q on stream %s (the gateway's scale signal): %w; "+
			"a consumer of that name that nats-server cannot change in place must be deleted (nats consumer rm %s %s), then dispatch started again",
			b.Name, GatewayConsumer, stream, err, stream, GatewayConsumer)
	}
	p := &Payloads{kv: kv, bucket: b.Name, aead: aead, opens: opens}
	if err := p.expireMarkers(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// expireMarkers replaces the marker of every deleted payload key by one that
// expires after PayloadMarkerTTL (a marker that already expires is renewed
// once: harmless). Each replacement expects the marker it saw as the key's
// last revision, so a payload written since is never purged.
func (p *Payloads) expireMarkers(ctx context.Context) error {
	entries, err := p.list(ctx, "replace deletion markers", true)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Operation() == jetstream.KeyValuePut {
			continue
		}
		err := p.kv.Purge(ctx, e.Key(), jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(PayloadMarkerTTL))
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch): // written, or expired, since
		case err != nil:
			return fmt.Errorf("payload store %q: replace the deletion marker of %s: %w", p.bucket, e.Key(), err)
		}
	}
	return nil
}

// OpenPayloads returns the store of an existing bucket without changing its
// configuration (the gateway and recover read what dispatch created). The
// key requirements are those of EnsurePayloads. A bucket that still answers
// reads from any replica is refused (ErrDirectReads) until dispatch has
// converged it.
func OpenPayloads(ctx context.Context, js jetstream.JetStream, bucket string, key secretkey.Key, old ...secretkey.Key) (*Payloads, error) {
	aead, opens, err := newAEADs(bucket, key, old)
	if err != nil {
		return nil, err
	}
	kv, err := openBucket(ctx, js, bucket, "payload store")
	if err != nil {
		return nil, err
	}
	return &Payloads{kv: kv, bucket: bucket, aead: aead, opens: opens}, nil
}

// newAEADs returns the cipher that seals (key's) and those that open, in the
// order they are tried: key's, then each of old's. Errors name an old key by
// its position (1 is the first), never a key.
func newAEADs(bucket string, key secretkey.Key, old []secretkey.Key) (cipher.AEAD, []cipher.AEAD, error) {
	seal, err := newAEAD(bucket, "key", key)
	if err != nil {
		return nil, nil, err
	}
	opens := []cipher.AEAD{seal}
	for i, k := range old {
		aead, err := newAEAD(bucket, fmt.Sprintf("old key %d", i+1), k)
		if err != nil {
			return nil, nil, err
		}
		opens = append(opens, aead)
	}
	return seal, opens, nil
}

// newAEAD returns the cipher of key, which what names in errors.
func newAEAD(bucket, what string, key secretkey.Key) (cipher.AEAD, error) {
	if len(key) != payloadKeySize {
		return nil, fmt.Errorf("payload store %q: %s has %d bytes, need exactly %d", bucket, what, len(key), payloadKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("payload store %q: cipher: %w", bucket, err)
	}
	// The random-nonce GCM writes the 12-byte nonce ahead of the ciphertext
	// and reads it back from there, which is exactly the stored layout after
	// the version byte.
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("payload store %q: cipher: %w", bucket, err)
	}
	return aead, nil
}

// Bucket returns the name of the store's bucket.
func (p *Payloads) Bucket() string { return p.bucket }

// Put stores task, secrets included, under assignmentID, replacing any value
// already there (so re-dispatching an assignment is idempotent). Only the
// sealed form reaches the server.
func (p *Payloads) Put(ctx context.Context, assignmentID string, task *runnerv1.Task) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: put: empty assignment ID", p.bucket)
	}
	if task == nil {
		return fmt.Errorf("payload store %q: put assignment %s: no task", p.bucket, assignmentID)
	}
	plain, err := proto.Marshal(task)
	if err != nil {
		// Marshal errors name fields, not values; keep only ours regardless.
		return fmt.Errorf("payload store %q: put assignment %s: task %d does not marshal", p.bucket, assignmentID, task.GetId())
	}
	sealed := p.aead.Seal([]byte{sealVersion}, nil, plain, []byte(assignmentID))
	clear(plain)
	if _, err := p.kv.Put(ctx, assignmentID, sealed); err != nil {
		return fmt.Errorf("payload store %q: put assignment %s: %w", p.bucket, assignmentID, err)
	}
	return nil
}

// Get returns the task stored under assignmentID. It wraps taskassignment.ErrPayloadNotFound
// if there is none, and ErrPayloadSealed if the stored value opens under
// none of this store's keys (the current one, then each old one) for this ID
// or does not hold a task.
func (p *Payloads) Get(ctx context.Context, assignmentID string) (*runnerv1.Task, error) {
	if assignmentID == "" {
		return nil, fmt.Errorf("payload store %q: get: empty assignment ID", p.bucket)
	}
	e, err := p.kv.Get(ctx, assignmentID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("payload store %q: assignment %s: %w", p.bucket, assignmentID, taskassignment.ErrPayloadNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("payload store %q: get assignment %s: %w", p.bucket, assignmentID, err)
	}
	value := e.Value()
	if len(value) < 1+p.aead.Overhead() {
		return nil, fmt.Errorf("payload store %q: assignment %s: %w: value of %d bytes is too short", p.bucket, assignmentID, ErrPayloadSealed, len(value))
	}
	if value[0] != sealVersion {
		return nil, fmt.Errorf("payload store %q: assignment %s: %w: unknown seal version %d", p.bucket, assignmentID, ErrPayloadSealed, value[0])
	}
	plain, ok := p.open(value[1:], assignmentID)
	if !ok {
		return nil, fmt.Errorf("payload store %q: assignment %s: %w: authentication failed", p.bucket, assignmentID, ErrPayloadSealed)
	}
	task := new(runnerv1.Task)
	err = proto.Unmarshal(plain, task)
	clear(plain)
	if err != nil {
		return nil, fmt.Errorf("payload store %q: assignment %s: %w: not a task", p.bucket, assignmentID, ErrPayloadSealed)
	}
	return task, nil
}

// open returns sealed opened under the first of the store's keys that
// authenticates it for assignmentID, and whether one did.
func (p *Payloads) open(sealed []byte, assignmentID string) ([]byte, bool) {
	for _, aead := range p.opens {
		if plain, err := aead.Open(nil, nil, sealed, []byte(assignmentID)); err == nil {
			return plain, true
		}
	}
	return nil, false
}

// Delete removes the payload of assignmentID and every earlier revision of
// it, and its marks. Deleting a payload that is not there succeeds. Each key
// is purged with a marker that expires after PayloadMarkerTTL, when the
// GatewayConsumer stops counting the payload; on a bucket that takes no
// message TTLs yet (an upgrade, before dispatch converged it) the marker is a
// plain one, counted until the bucket's TTL.
func (p *Payloads) Delete(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: delete: empty assignment ID", p.bucket)
	}
	// The marks first: a crash before the payload's purge leaves the payload,
	// which the next pass finds and deletes again. The started mark once more
	// last: a gateway's MarkStarted that read the payload before this delete
	// may land after the first purge (the gateway removes the mark itself
	// when it reads the payload gone after marking; see gateway's stillBound).
	for _, key := range []string{startedPrefix + assignmentID, sentPrefix + assignmentID, assignmentID, startedPrefix + assignmentID} {
		if err := p.purge(ctx, key); err != nil {
			return fmt.Errorf("payload store %q: delete assignment %s: %w", p.bucket, assignmentID, err)
		}
	}
	return nil
}

// Unmark removes assignmentID's started mark (a gateway that marked a task
// whose payload was deleted meanwhile).
func (p *Payloads) Unmark(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: unmark: empty assignment ID", p.bucket)
	}
	if err := p.purge(ctx, startedPrefix+assignmentID); err != nil {
		return fmt.Errorf("payload store %q: unmark assignment %s: %w", p.bucket, assignmentID, err)
	}
	return nil
}

// purge purges key, leaving a delete marker that expires (PayloadMarkerTTL)
// where the bucket allows message TTLs, else one that stays.
func (p *Payloads) purge(ctx context.Context, key string) error {
	err := p.kv.Purge(ctx, key, jetstream.PurgeTTL(PayloadMarkerTTL))
	if ttlDisabled(err) {
		err = p.kv.Purge(ctx, key)
	}
	return err
}

// errCodeMessageTTLDisabled is nats-server's JSMessageTTLDisabledErr: a
// message with a TTL sent to a stream that does not allow them.
const errCodeMessageTTLDisabled jetstream.ErrorCode = 10166

// ttlDisabled reports whether err is the server refusing a message TTL.
func ttlDisabled(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMessageTTLDisabled
}

// startedPrefix marks, beside a payload, that its executor has taken it. A
// payload ID never starts with it: assignment IDs start with a pool name,
// which has no dot.
const startedPrefix = "started."

// MarkStarted records that the executor of assignmentID has fetched its task
// and reports on it from now on. Whoever keeps queued tasks alive stops
// there: a bare heartbeat would undo the executor's step reports.
func (p *Payloads) MarkStarted(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: mark started: empty assignment ID", p.bucket)
	}
	if _, err := p.kv.Put(ctx, startedPrefix+assignmentID, []byte{1}); err != nil {
		return fmt.Errorf("payload store %q: mark assignment %s started: %w", p.bucket, assignmentID, err)
	}
	return nil
}

// Started reports whether MarkStarted was called for assignmentID (and the
// mark has not expired or been deleted with the payload).
func (p *Payloads) Started(ctx context.Context, assignmentID string) (bool, error) {
	_, err := p.kv.Get(ctx, startedPrefix+assignmentID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("payload store %q: assignment %s started: %w", p.bucket, assignmentID, err)
	}
	return true, nil
}

// sentPrefix marks, beside a payload, when recover last sent its assignment
// again (the Knative path, whose channel cannot be asked what it holds).
const sentPrefix = "sent."

// MarkSent records that the assignment of assignmentID was sent again now.
// A later pass takes the mark's time, not the payload's, as the start of the
// orphan grace, so an assignment that still waits is re-sent once per grace,
// never once per pass. Delete removes the mark with the payload.
func (p *Payloads) MarkSent(ctx context.Context, assignmentID string) error {
	if assignmentID == "" {
		return fmt.Errorf("payload store %q: mark sent: empty assignment ID", p.bucket)
	}
	if _, err := p.kv.Put(ctx, sentPrefix+assignmentID, []byte{1}); err != nil {
		return fmt.Errorf("payload store %q: mark assignment %s sent: %w", p.bucket, assignmentID, err)
	}
	return nil
}

// LastSent returns when the assignment of assignmentID was last sent: the
// time of its MarkSent, else when its payload was stored (dispatch sends
// right after the store). It wraps taskassignment.ErrPayloadNotFound when there is no
// payload.
func (p *Payloads) LastSent(ctx context.Context, assignmentID string) (time.Time, error) {
	stored, err := p.StoredAt(ctx, assignmentID)
	if err != nil {
		return time.Time{}, err
	}
	e, err := p.kv.Get(ctx, sentPrefix+assignmentID)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return stored, nil
	case err != nil:
		return time.Time{}, fmt.Errorf("payload store %q: assignment %s last sent: %w", p.bucket, assignmentID, err)
	}
	return later(stored, e.Created()), nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// IDs returns the assignment ID of every stored payload, sorted and without
// duplicates; an empty store yields an empty slice. IDs of deleted or expired
// payloads are not listed, nor are the started and sent marks. The listing
// may be a moment stale (see placement.go).
func (p *Payloads) IDs(ctx context.Context) ([]string, error) {
	entries, err := p.list(ctx, "list assignment IDs", false)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, e := range entries {
		ids = append(ids, e.Key())
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// listingStall is how long a listing waits for its next key before it starts
// over. The client's watcher ends its first pass once it has received as many
// keys as the server counted when the listing began, or a key with nothing
// pending after it. A deletion marker that expires (PayloadMarkerTTL) in
// between is never delivered, and the watcher would wait for it until some
// later write to the bucket: in an idle system, forever. The server sends a
// listing without pause (every key, deletion markers included, resets the
// wait), so a second of silence short of the end is such a marker, or a
// server that does not answer; a new listing counts only what is there. Each
// pass started over waits twice as long as the one before, up to
// maxListingStall, so a server that is merely slow still gets through.
const (
	listingStall    = time.Second
	maxListingStall = 30 * time.Second
)

// errListingStalled is a listing that received nothing for its stall wait
// before its end.
var errListingStalled = errors.New("the listing stalled before its last key")

// list returns the entry of every payload key (one token: the marks, two,
// are left out), metadata only, as one pass of an ordered consumer sees
// them; deletion markers are included only when withDeletes. A pass that
// stalls (listingStall) is started over until ctx ends. Errors name the
// bucket and what.
func (p *Payloads) list(ctx context.Context, what string, withDeletes bool) ([]jetstream.KeyValueEntry, error) {
	for stall := listingStall; ; stall = min(2*stall, maxListingStall) {
		entries, err := p.listOnce(ctx, withDeletes, stall)
		switch {
		case errors.Is(err, errListingStalled):
			continue
		case err != nil:
			return nil, fmt.Errorf("payload store %q: %s: %w", p.bucket, what, err)
		}
		return entries, nil
	}
}

// listOnce is one pass of list, given up after stallAfter without a key.
func (p *Payloads) listOnce(ctx context.Context, withDeletes bool, stallAfter time.Duration) ([]jetstream.KeyValueEntry, error) {
	// Payload keys are one token (an assignment ID has no dot); the marks
	// are two ("started.<id>", "sent.<id>"). Filtering on one token lists
	// the payloads alone: a round's cost follows the tasks in flight, not
	// the marks of every task the bucket's TTL still remembers.
	//
	// Deletion markers are delivered and dropped here rather than by the
	// watcher (IgnoreDeletes), so that each one resets the stall timer.
	//
	// The watcher's channel is read directly, not through a KeyLister: a
	// lister takes a channel closed under it (the connection closed or the
	// ordered consumer failed mid-listing) for the end of the listing and
	// returns a short list; here that is an error, never a short count that
	// would let dispatch claim past a pool's capacity.
	w, err := p.kv.WatchFiltered(ctx, []string{"*"}, jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	stall := time.NewTimer(stallAfter)
	defer stall.Stop()
	var entries []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return nil, errors.New("the listing ended before its last key")
			case e == nil: // every key present at the start has been seen
				return entries, nil
			case withDeletes || e.Operation() == jetstream.KeyValuePut:
				entries = append(entries, e)
			}
			stall.Reset(stallAfter)
		case <-stall.C:
			return nil, errListingStalled
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// PayloadSettings is embedded in the configuration of every function that reads
// or writes payloads.
type PayloadSettings struct {
	PayloadBucketSettings
	PayloadKey     secretkey.Key  `envconfig:"GDR_PAYLOAD_KEY" required:"true" desc:"base64 AES-256 key (32 bytes) sealing task payloads; dispatch, gateway and recover need the same one"`
	PayloadOldKeys secretkey.Keys `envconfig:"GDR_PAYLOAD_OLD_KEYS" desc:"comma-separated base64 AES-256 keys (32 bytes each) a stored payload is also opened with when GDR_PAYLOAD_KEY does not open it: a rotation's other key (docs/OPERATIONS.md, \"Rotating secrets\"); payloads are sealed with GDR_PAYLOAD_KEY alone; set wherever GDR_PAYLOAD_KEY is"`
}

// PayloadBucketSettings names the payload bucket; handle embeds it alone, for the end
// marks (Endings), never holding the payload key.
type PayloadBucketSettings struct {
	PayloadBucket string `envconfig:"GDR_PAYLOAD_BUCKET" default:"CI_TASKS" desc:"JetStream key-value bucket of sealed task payloads"`
}

// Check reports a payload key, current or old, that is not exactly 32
// bytes, naming the variable (and an old key's position) and never a key.
func (p PayloadSettings) Check() error {
	var current error
	if len(p.PayloadKey) != payloadKeySize {
		current = fmt.Errorf("GDR_PAYLOAD_KEY: key has %d bytes, need exactly %d", len(p.PayloadKey), payloadKeySize)
	}
	return errors.Join(current, p.PayloadOldKeys.Exactly("GDR_PAYLOAD_OLD_KEYS", payloadKeySize))
}

// Stored returns when each stored payload was written, by assignment ID,
// like IDs (the same meta-only listing: no payload byte is read, so it
// needs no more than IDs' grants). The marks are not listed.
func (p *Payloads) Stored(ctx context.Context) (map[string]time.Time, error) {
	entries, err := p.list(ctx, "list payloads", false)
	if err != nil {
		return nil, err
	}
	stored := map[string]time.Time{}
	for _, e := range entries {
		stored[e.Key()] = e.Created()
	}
	return stored, nil
}

// StoredAt returns when the payload of assignmentID was stored (the task's
// claim), without opening it; it wraps taskassignment.ErrPayloadNotFound if there is none.
func (p *Payloads) StoredAt(ctx context.Context, assignmentID string) (time.Time, error) {
	e, err := p.kv.Get(ctx, assignmentID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, fmt.Errorf("payload store %q: assignment %s: %w", p.bucket, assignmentID, taskassignment.ErrPayloadNotFound)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("payload store %q: assignment %s: %w", p.bucket, assignmentID, err)
	}
	return e.Created(), nil
}
