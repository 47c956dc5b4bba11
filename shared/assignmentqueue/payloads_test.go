package assignmentqueue_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/assignmentqueue"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/secretkey"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

const (
	testBucket  = "TASKS_TEST"
	secretValue = "s3cr3t-value-that-must-not-leak"
	tokenValue  = "runtime-token-that-must-not-leak"
)

// testKey returns a 32-byte key whose bytes all equal b.
func testKey(b byte) secretkey.Key { return secretkey.Key(bytes.Repeat([]byte{b}, 32)) }

// testTask returns a task carrying secrets, a token in its context, vars
// and a workflow.
func testTask(t testing.TB, id int64) *runnerv1.Task {
	t.Helper()
	ctxStruct, err := structpb.NewStruct(map[string]any{
		"repository":          "Owner/Repo",
		"job":                 "build",
		"gitea_runtime_token": tokenValue,
		"event":               map[string]any{"ref": "refs/heads/main", "number": 7.0},
	})
	if err != nil {
		t.Fatalf("context: %v", err)
	}
	return &runnerv1.Task{
		Id:              id,
		WorkflowPayload: []byte("on: push\njobs:\n  build:\n    runs-on: ubuntu-latest\n"),
		Context:         ctxStruct,
		Secrets:         map[string]string{"DEPLOY_KEY": secretValue, "GITEA_TOKEN": tokenValue},
		Vars:            map[string]string{"REGION": "eu"},
	}
}

// newPayloads returns a store in testBucket on a fresh server, with the
// JetStream context and the bucket's raw key-value view for tampering.
func newPayloads(t testing.TB, key secretkey.Key) (context.Context, jetstream.JetStream, *assignmentqueue.Payloads, jetstream.KeyValue) {
	t.Helper()
	ctx := testContext(t)
	js := newJetStream(t)
	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, key)
	if err != nil {
		t.Fatalf("EnsurePayloads: %v", err)
	}
	raw, err := js.KeyValue(ctx, testBucket)
	if err != nil {
		t.Fatalf("raw bucket: %v", err)
	}
	return ctx, js, p, raw
}

// checkNoSecret fails the test if err's text holds a task secret or key.
func checkNoSecret(t *testing.T, err error, key secretkey.Key) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	for _, s := range []string{secretValue, tokenValue, string(key), hex.EncodeToString(key), base64.StdEncoding.EncodeToString(key)} {
		if s != "" && strings.Contains(msg, s) {
			t.Errorf("error %q leaks a secret or the key", msg)
		}
	}
}

// bucketConfig returns the configuration of testBucket.
func bucketConfig(t testing.TB, ctx context.Context, js jetstream.JetStream) jetstream.KeyValueConfig {
	t.Helper()
	kv, err := js.KeyValue(ctx, testBucket)
	if err != nil {
		t.Fatalf("bucket: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st.Config()
}

func TestEnsurePayloadsConfig(t *testing.T) {
	ctx, js, _, _ := newPayloads(t, testKey(1))
	check := func(ttl time.Duration) {
		t.Helper()
		cfg := bucketConfig(t, ctx, js)
		if cfg.TTL != ttl || cfg.History != 1 || cfg.Storage != jetstream.FileStorage {
			t.Errorf("bucket TTL %v, history %d, storage %v; want %v, 1, file", cfg.TTL, cfg.History, cfg.Storage, ttl)
		}
	}
	check(time.Hour)
	// Ensuring again with a longer TTL corrects the bucket in place.
	if _, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: 3 * time.Hour}, testKey(1)); err != nil {
		t.Fatalf("second EnsurePayloads: %v", err)
	}
	check(3 * time.Hour)
}

// A bucket's TTL only ever grows: a process that knows only shorter pools
// must not expire the payloads of everyone's running jobs early.
func TestEnsurePayloadsNeverShrinksTheTTL(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	for _, step := range []struct {
		ensure, want time.Duration
	}{
		{4 * time.Hour, 4 * time.Hour},
		{2 * time.Hour, 4 * time.Hour},
		{5 * time.Hour, 5 * time.Hour},
		{time.Hour, 5 * time.Hour},
	} {
		if _, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: step.ensure}, testKey(1)); err != nil {
			t.Fatalf("EnsurePayloads(%v): %v", step.ensure, err)
		}
		if got := bucketConfig(t, ctx, js).TTL; got != step.want {
			t.Fatalf("after EnsurePayloads(%v): TTL %v, want %v", step.ensure, got, step.want)
		}
	}
}

func TestEnsurePayloadsRefuses(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	for _, tc := range []struct {
		name string
		key  secretkey.Key
		ttl  time.Duration
		want string
	}{
		{"16-byte key", secretkey.Key("0123456789abcdef"), time.Hour, "16 bytes"},
		{"33-byte key", secretkey.Key(strings.Repeat("k", 33)), time.Hour, "33 bytes"},
		{"no key", nil, time.Hour, "0 bytes"},
		{"zero TTL", testKey(1), 0, "TTL"},
		{"negative TTL", testKey(1), -time.Second, "TTL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: tc.ttl}, tc.key)
			if err == nil || p != nil {
				t.Fatalf("EnsurePayloads = %v, %v; want an error", p, err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), testBucket) {
				t.Errorf("error %q does not name %q and the bucket", err, tc.want)
			}
			checkNoSecret(t, err, tc.key)
		})
	}
	if _, err := js.KeyValue(ctx, testBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("refused EnsurePayloads created the bucket (err = %v)", err)
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	ctx, _, p, raw := newPayloads(t, testKey(1))
	want := testTask(t, 42)
	if err := p.Put(ctx, "pool-a-42", want); err != nil {
		t.Fatalf("Put: %v", err)
	}
	got, err := p.Get(ctx, "pool-a-42")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("Get = %v, want %v", got, want)
	}
	if got.GetSecrets()["DEPLOY_KEY"] != secretValue || got.GetContext().GetFields()["gitea_runtime_token"].GetStringValue() != tokenValue {
		t.Errorf("round trip lost the secrets or the token")
	}

	// What the server holds is sealed: no plaintext and the stated layout.
	e, err := raw.Get(ctx, "pool-a-42")
	if err != nil {
		t.Fatalf("raw get: %v", err)
	}
	v := e.Value()
	for _, s := range []string{secretValue, tokenValue, "DEPLOY_KEY", "runs-on"} {
		if bytes.Contains(v, []byte(s)) {
			t.Errorf("stored value contains %q in plaintext", s)
		}
	}
	plain, _ := proto.Marshal(want)
	if v[0] != 1 || len(v) != 1+12+len(plain)+16 {
		t.Errorf("stored value: version %d, %d bytes; want version 1, %d bytes", v[0], len(v), 1+12+len(plain)+16)
	}
}

func TestPayloadPutOverwrites(t *testing.T) {
	ctx, _, p, raw := newPayloads(t, testKey(1))
	first, second := testTask(t, 1), testTask(t, 1)
	second.Vars["REGION"] = "us"
	for _, task := range []*runnerv1.Task{first, second} {
		if err := p.Put(ctx, "pool-a-1", task); err != nil {
			t.Fatalf("Put: %v", err)
		}
	}
	got, err := p.Get(ctx, "pool-a-1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !proto.Equal(got, second) {
		t.Errorf("Get after overwrite = %v, want the second task", got)
	}
	hist, err := raw.History(ctx, "pool-a-1")
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	if len(hist) != 1 {
		t.Errorf("bucket keeps %d revisions, want 1", len(hist))
	}
}

func TestPayloadSealed(t *testing.T) {
	ctx, js, p, raw := newPayloads(t, testKey(1))
	const id = "pool-a-7"
	if err := p.Put(ctx, id, testTask(t, 7)); err != nil {
		t.Fatalf("Put: %v", err)
	}
	e, err := raw.Get(ctx, id)
	if err != nil {
		t.Fatalf("raw get: %v", err)
	}
	sealed := e.Value()

	// put stores value under key in the raw bucket and returns key.
	put := func(key string, value []byte) string {
		t.Helper()
		if _, err := raw.Put(ctx, key, value); err != nil {
			t.Fatalf("raw put: %v", err)
		}
		return key
	}
	flip := func(i int) []byte {
		v := slices.Clone(sealed)
		v[i] ^= 0x01
		return v
	}
	otherKey, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(2))
	if err != nil {
		t.Fatalf("EnsurePayloads with another key: %v", err)
	}
	for _, tc := range []struct {
		name  string
		store *assignmentqueue.Payloads
		id    func() string
	}{
		{"wrong key", otherKey, func() string { return id }},
		{"copied under another ID", p, func() string { return put("pool-a-8", sealed) }},
		{"version byte changed", p, func() string { return put("t-version", flip(0)) }},
		{"nonce byte changed", p, func() string { return put("t-nonce", flip(5)) }},
		{"ciphertext byte changed", p, func() string { return put("t-body", flip(20)) }},
		{"tag byte changed", p, func() string { return put("t-tag", flip(len(sealed)-1)) }},
		{"truncated", p, func() string { return put("t-short", sealed[:len(sealed)-1]) }},
		{"too short for a nonce", p, func() string { return put("t-tiny", sealed[:10]) }},
		{"plaintext task", p, func() string {
			b, _ := proto.Marshal(testTask(t, 9))
			return put("t-plain", b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.id()
			got, err := tc.store.Get(ctx, key)
			if !errors.Is(err, assignmentqueue.ErrPayloadSealed) {
				t.Fatalf("Get = %v, %v; want ErrPayloadSealed", got, err)
			}
			if got != nil {
				t.Errorf("Get returned a task with ErrPayloadSealed")
			}
			if !strings.Contains(err.Error(), key) {
				t.Errorf("error %q does not name assignment %s", err, key)
			}
			checkNoSecret(t, err, testKey(1))
			checkNoSecret(t, err, testKey(2))
		})
	}
	// Nothing above disturbed the original.
	if _, err := p.Get(ctx, id); err != nil {
		t.Errorf("Get of the original after the copies: %v", err)
	}
}

func TestPayloadNotFoundAndDelete(t *testing.T) {
	ctx, _, p, _ := newPayloads(t, testKey(1))
	if _, err := p.Get(ctx, "pool-a-1"); !errors.Is(err, taskassignment.ErrPayloadNotFound) {
		t.Fatalf("Get of a missing payload: err = %v, want taskassignment.ErrPayloadNotFound", err)
	} else if !strings.Contains(err.Error(), "pool-a-1") {
		t.Errorf("error %q does not name the assignment", err)
	}
	if err := p.Delete(ctx, "pool-a-1"); err != nil {
		t.Fatalf("Delete of a missing payload: %v", err)
	}
	if err := p.Put(ctx, "pool-a-1", testTask(t, 1)); err != nil {
		t.Fatalf("Put: %v", err)
	}
	for i := range 2 {
		if err := p.Delete(ctx, "pool-a-1"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := p.Get(ctx, "pool-a-1"); !errors.Is(err, taskassignment.ErrPayloadNotFound) {
		t.Errorf("Get after Delete: err = %v, want taskassignment.ErrPayloadNotFound", err)
	}
	// A deleted payload can be put again.
	if err := p.Put(ctx, "pool-a-1", testTask(t, 1)); err != nil {
		t.Fatalf("Put after Delete: %v", err)
	}
	if _, err := p.Get(ctx, "pool-a-1"); err != nil {
		t.Errorf("Get after re-Put: %v", err)
	}
}

func TestPayloadIDs(t *testing.T) {
	ctx, _, p, _ := newPayloads(t, testKey(1))
	ids, err := p.IDs(ctx)
	if err != nil || ids == nil || len(ids) != 0 {
		t.Fatalf("IDs of an empty store = %#v, %v; want an empty slice", ids, err)
	}
	for _, id := range []string{"pool-b-3", "pool-a-1", "pool-a-2"} {
		if err := p.Put(ctx, id, testTask(t, 1)); err != nil {
			t.Fatalf("Put %s: %v", id, err)
		}
	}
	if err := p.Put(ctx, "pool-a-1", testTask(t, 1)); err != nil {
		t.Fatalf("re-Put: %v", err)
	}
	if err := p.Delete(ctx, "pool-a-2"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	ids, err = p.IDs(ctx)
	if err != nil {
		t.Fatalf("IDs: %v", err)
	}
	if want := []string{"pool-a-1", "pool-b-3"}; !slices.Equal(ids, want) {
		t.Errorf("IDs = %v, want %v", ids, want)
	}
	if err := p.Delete(ctx, "pool-a-1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := p.Delete(ctx, "pool-b-3"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if ids, err := p.IDs(ctx); err != nil || len(ids) != 0 || ids == nil {
		t.Errorf("IDs after deleting all = %#v, %v; want an empty slice", ids, err)
	}
}

func TestPayloadExpires(t *testing.T) {
	ctx := testContext(t)
	js := newJetStream(t)
	p, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: 300 * time.Millisecond}, testKey(1))
	if err != nil {
		t.Fatalf("EnsurePayloads: %v", err)
	}
	if err := p.Put(ctx, "pool-a-1", testTask(t, 1)); err != nil {
		t.Fatalf("Put: %v", err)
	}
	eventually(t, "payload expires after the TTL", func() (bool, string) {
		_, err := p.Get(ctx, "pool-a-1")
		return errors.Is(err, taskassignment.ErrPayloadNotFound), fmt.Sprintf("Get error %v", err)
	})
	if ids, err := p.IDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("IDs after expiry = %v, %v; want none", ids, err)
	}
}

func TestPayloadErrorsKeepSecrets(t *testing.T) {
	ctx, _, p, _ := newPayloads(t, testKey(1))
	bad := testTask(t, 1)
	bad.Secrets["BROKEN"] = secretValue + "\xff" // not UTF-8: does not marshal
	var errs []error
	errs = append(errs, p.Put(ctx, "pool-a-1", bad))
	errs = append(errs, p.Put(ctx, "bad key with spaces", testTask(t, 1)))
	errs = append(errs, p.Put(ctx, "", testTask(t, 1)))
	errs = append(errs, p.Put(ctx, "pool-a-1", nil))
	for i, err := range errs {
		if err == nil {
			t.Errorf("case %d: Put succeeded", i)
		}
		checkNoSecret(t, err, testKey(1))
	}
	if ids, err := p.IDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("failed Puts stored %v (%v)", ids, err)
	}
}

func TestPayloadStartedMark(t *testing.T) {
	ctx, _, p, _ := newPayloads(t, testKey(1))
	if err := p.Put(ctx, "linux-1", testTask(t, 1)); err != nil {
		t.Fatal(err)
	}
	if started, err := p.Started(ctx, "linux-1"); err != nil || started {
		t.Fatalf("Started before MarkStarted = %v, %v", started, err)
	}
	if err := p.MarkStarted(ctx, "linux-1"); err != nil {
		t.Fatal(err)
	}
	if started, err := p.Started(ctx, "linux-1"); err != nil || !started {
		t.Fatalf("Started after MarkStarted = %v, %v", started, err)
	}
	ids, err := p.IDs(ctx)
	if err != nil || !slices.Equal(ids, []string{"linux-1"}) {
		t.Fatalf("IDs() = %v, %v: the mark is not a payload", ids, err)
	}
	if err := p.Delete(ctx, "linux-1"); err != nil {
		t.Fatal(err)
	}
	if started, err := p.Started(ctx, "linux-1"); err != nil || started {
		t.Fatalf("Started after Delete = %v, %v", started, err)
	}
}

func TestOpenPayloads(t *testing.T) {
	ctx, js, p, _ := newPayloads(t, testKey(1))
	if err := p.Put(ctx, "linux-1", testTask(t, 1)); err != nil {
		t.Fatal(err)
	}
	reader, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	if task, err := reader.Get(ctx, "linux-1"); err != nil || task.GetId() != 1 {
		t.Fatalf("Get through OpenPayloads = %v, %v", task, err)
	}
	if _, err := assignmentqueue.OpenPayloads(ctx, js, "NO_SUCH_BUCKET", testKey(1)); err == nil {
		t.Fatal("OpenPayloads of a missing bucket succeeded")
	}
	if _, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(1)[:16]); err == nil {
		t.Fatal("OpenPayloads with a 16-byte key succeeded")
	}
}

// TestPayloadOldKeys: a payload key rotation. A value sealed under a key opens in a store whose
// current key or listed old key it is, and in no other; a store always seals with its current
// key. The add phase's reader (the new key listed as old, before dispatch seals with it) and the
// swap phase's (the old key listed) both read every payload.
func TestPayloadOldKeys(t *testing.T) {
	ctx, js, _, _ := newPayloads(t, testKey(9))
	for _, tc := range []struct {
		name    string
		sealed  byte   // the key the writer sealed with
		current byte   // the reader's GDR_PAYLOAD_KEY
		old     []byte // the reader's GDR_PAYLOAD_OLD_KEYS
		opens   bool
	}{
		{"the current key", 1, 1, nil, true},
		{"the current key, old keys listed", 1, 1, []byte{2, 3}, true},
		{"the old key listed (swap)", 1, 2, []byte{1}, true},
		{"the old key listed second", 1, 2, []byte{3, 1}, true},
		{"the new key listed before dispatch seals with it (add)", 2, 1, []byte{2}, true},
		{"no old key", 1, 2, nil, false},
		{"the old key not listed (drop)", 1, 2, []byte{3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writer, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(tc.sealed))
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("pool-a-%d%d%d", tc.sealed, tc.current, len(tc.old))
			if err := writer.Put(ctx, id, testTask(t, 7)); err != nil {
				t.Fatal(err)
			}
			var old []secretkey.Key
			for _, b := range tc.old {
				old = append(old, testKey(b))
			}
			reader, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(tc.current), old...)
			if err != nil {
				t.Fatal(err)
			}
			task, err := reader.Get(ctx, id)
			switch {
			case tc.opens && (err != nil || task.GetId() != 7):
				t.Fatalf("Get = %v, %v; want task 7", task, err)
			case !tc.opens && (!errors.Is(err, assignmentqueue.ErrPayloadSealed) || task != nil):
				t.Fatalf("Get = %v, %v; want ErrPayloadSealed", task, err)
			}
			for _, b := range append([]byte{tc.sealed, tc.current}, tc.old...) {
				checkNoSecret(t, err, testKey(b))
			}
		})
	}

	// Sealing always uses the current key: a store with old keys writes what the current key
	// alone opens, and an old key alone does not.
	both, err := assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(2), testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := both.Put(ctx, "pool-a-1", testTask(t, 1)); err != nil {
		t.Fatal(err)
	}
	for key, opens := range map[byte]bool{2: true, 1: false} {
		alone, err := assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(key))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alone.Get(ctx, "pool-a-1"); (err == nil) != opens {
			t.Errorf("a value put by a store with current key 2 and old key 1, read with key %d alone: %v", key, err)
		}
	}

	// A malformed old key is refused by position, never shown.
	short := testKey(4)[:16]
	for name, open := range map[string]func() (*assignmentqueue.Payloads, error){
		"OpenPayloads": func() (*assignmentqueue.Payloads, error) {
			return assignmentqueue.OpenPayloads(ctx, js, testBucket, testKey(1), testKey(2), short)
		},
		"EnsurePayloads": func() (*assignmentqueue.Payloads, error) {
			return assignmentqueue.EnsurePayloads(ctx, js, assignmentqueue.Bucket{Name: testBucket, TTL: time.Hour}, testKey(1), testKey(2), short)
		},
	} {
		if p, err := open(); err == nil || !strings.Contains(err.Error(), "old key 2 has 16 bytes") {
			t.Errorf("%s with a 16-byte second old key = %v, %v; want an error naming old key 2", name, p, err)
		} else {
			checkNoSecret(t, err, short)
		}
	}
}

// TestPayloadSettingsCheck: GDR_PAYLOAD_OLD_KEYS is checked key by key, its errors naming the
// variable and the key's position, never a key.
func TestPayloadSettingsCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       assignmentqueue.PayloadSettings
		wantErr []string
	}{
		{"current only", assignmentqueue.PayloadSettings{PayloadKey: testKey(1)}, nil},
		{"old keys", assignmentqueue.PayloadSettings{PayloadKey: testKey(1), PayloadOldKeys: secretkey.Keys{testKey(2), testKey(3)}}, nil},
		{"short current", assignmentqueue.PayloadSettings{PayloadKey: testKey(1)[:5]}, []string{"GDR_PAYLOAD_KEY: key has 5 bytes"}},
		{"a short old key", assignmentqueue.PayloadSettings{PayloadKey: testKey(1), PayloadOldKeys: secretkey.Keys{testKey(2), testKey(3)[:31]}},
			[]string{"GDR_PAYLOAD_OLD_KEYS: key 2 has 31 bytes, need exactly 32"}},
		{"a long old key", assignmentqueue.PayloadSettings{PayloadKey: testKey(1), PayloadOldKeys: secretkey.Keys{append(testKey(2), 0)}},
			[]string{"GDR_PAYLOAD_OLD_KEYS: key 1 has 33 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Check()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("Check() = %v, want it to say %q", err, want)
				}
			}
			for _, k := range append(tc.s.PayloadOldKeys, tc.s.PayloadKey) {
				checkNoSecret(t, err, k)
			}
		})
	}
}
