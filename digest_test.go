package ceiling

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// With a key secret, the stored key is "{tag}:rule", the tag the first 16
// bytes of the HMAC-SHA256 of the value. A short value must not shorten
// the digest: before the fix only len(value) bytes of the MAC were kept and
// the rest were zeros, so user ids "17" and "42" kept 16 bits each and
// collided easily.
func TestKeySecretDigestKeepsSixteenBytesOfShortValuesRegression(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	l := MustNew([]Rule{{Name: "user", Key: Static("x"), Limit: 1, Period: time.Second}}, WithKeySecret(secret), WithBackend(&scripted{}))
	for _, v := range []string{"", "7", "42", "10.0.0.1", "+254700000000", "a-user-id-longer-than-thirty-two-bytes-0123456789"} {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(v))
		want := "{" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:digestLen]) + "}:user"
		if got := l.request(&l.rules[0], v).Key; got != want {
			t.Errorf("stored key of %q = %q, want %q", v, got, want)
		}
	}
}

// ruleOf is the rule name of a stored key "{tag}:rule".
func ruleOf(key string) string {
	_, rule, _ := strings.Cut(key, "}:")
	return rule
}

// tagOf is the tag of a stored key "{tag}:rule".
func tagOf(key string) string {
	tag, _, _ := strings.Cut(strings.TrimPrefix(key, "{"), "}:")
	return tag
}

// TestStoredKeysTagTheValueAndNameTheRule pins issue 30's fifth item: the
// rules of one key value share the tag, so a Redis Cluster stores them in
// one slot, while the rule name outside it keeps their keys apart; two
// values, or one value under two secrets, have unrelated tags; and no tag
// holds the value.
func TestStoredKeysTagTheValueAndNameTheRule(t *testing.T) {
	secrets := [][]byte{[]byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")}
	limiter := func(opts ...Option) *Limiter {
		l := MustNew([]Rule{
			{Name: "chat:minute", Key: Static("x"), Limit: 1, Period: time.Minute},
			{Name: "chat:day", Key: Static("x"), Limit: 1, Period: 24 * time.Hour},
			{Name: "otp:ip", Key: Static("x"), Limit: 1, Period: time.Minute},
		}, append(opts, WithBackend(&scripted{}), WithLogger(slog.New(slog.DiscardHandler)))...)
		t.Cleanup(func() { l.Close() })
		return l
	}
	values := []string{"shop-1", "shop-2", "192.0.2.1", "2001:db8:1:2::/64", "{x}", "a}:b"}
	tags := map[string]string{} // tag -> secret index and value
	for si, opts := range [][]Option{nil, {WithKeySecret(secrets[0])}, {WithKeySecret(secrets[1])}} {
		l := limiter(opts...)
		for _, v := range values {
			var keys []string
			for i := range l.rules {
				k := l.request(&l.rules[i], v).Key
				if got, want := ruleOf(k), l.rules[i].Name; got != want || !strings.HasPrefix(k, "{") {
					t.Errorf("stored key %q: rule %q, want \"{tag}:%s\"", k, got, want)
				}
				if again := l.request(&l.rules[i], v).Key; again != k {
					t.Errorf("stored key %q then %q, want it stable", k, again)
				}
				if slices.Contains(keys, k) {
					t.Errorf("%q under two rules: one key %q", v, k)
				}
				keys = append(keys, k)
			}
			tag := tagOf(keys[0])
			for _, k := range keys[1:] {
				if tagOf(k) != tag {
					t.Errorf("%q: keys %q and %q, want one tag for every rule of a value", v, keys[0], k)
				}
			}
			if len(tag) != 22 || strings.ContainsAny(tag, "{}:") || strings.Contains(tag, v) {
				t.Errorf("%q: tag %q, want 22 characters of base64url", v, tag)
			}
			id := fmt.Sprintf("secret %d, value %q", si, v)
			if other, ok := tags[tag]; ok {
				t.Errorf("%s and %s: one tag %q", id, other, tag)
			}
			tags[tag] = id
		}
	}
	// Without a secret the tag is SHA-256 of the value: pinned, since a
	// change moves every stored key.
	sum := sha256.Sum256([]byte("192.0.2.1"))
	plain := limiter()
	if got, want := plain.request(&plain.rules[2], "192.0.2.1").Key, "{"+base64.RawURLEncoding.EncodeToString(sum[:digestLen])+"}:otp:ip"; got != want {
		t.Errorf("otp:ip key of 192.0.2.1 = %q, want %q", got, want)
	}
}

// Without a key secret a remote backend's stored keys can be reversed by
// hashing candidates: the limiter says so once, at start, in the log and in
// its health report; with a secret, or with the in-process memory store,
// it says nothing.
func TestNoKeySecretWithARemoteBackendWarns(t *testing.T) {
	redisBackend := func() Option {
		return WithBackend(ceilingredis.New(redistest.Shared(t).Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t))))
	}
	for _, tc := range []struct {
		name string
		opts []Option
		warn bool
	}{
		{"redis, no secret", []Option{redisBackend()}, true},
		{"any remote backend, no secret", []Option{WithBackend(&scripted{})}, true},
		{"redis with a secret", []Option{redisBackend(), WithKeySecret([]byte("0123456789abcdef0123456789abcdef"))}, false},
		{"memory", nil, false},
	} {
		var logs bytes.Buffer
		l := MustNew([]Rule{{Name: "otp:phone", Key: Static("x"), Limit: 3, Period: time.Minute}},
			append(tc.opts, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))...)
		h := l.Handler(okHandler)
		for range 3 {
			serve(t, h, ipRequest("192.0.2.1:1"))
		}
		logged := strings.Count(logs.String(), "no key secret")
		var inHealth bool
		for _, w := range l.Health().Warnings {
			inHealth = inHealth || strings.Contains(w, "no key secret") && strings.Contains(w, "WithKeySecret")
		}
		if tc.warn && (logged != 1 || !inHealth) || !tc.warn && (logged != 0 || inHealth) {
			t.Errorf("%s: warned %d times in the log, in the health report: %v; want a warning: %v\n%s", tc.name, logged, inHealth, tc.warn, logs.String())
		}
		l.Close()
	}
}

// hashingBackend is a backend that says it hashes keys itself, or that it
// does not.
type hashingBackend struct {
	scripted
	hashes bool
}

func (h *hashingBackend) HashesKeys() bool { return h.hashes }

// A backend that hashes keys itself, the memory store or any other, is sent
// "rule\x00value" undigested; one that does not say so, or says false (a
// wrapper that keeps the keys it sees), is sent the digest.
func TestBackendsThatHashKeysGetThemUndigested(t *testing.T) {
	store := memory.New()
	defer store.Close()
	sum := sha256.Sum256([]byte("192.0.2.1"))
	digested := "{" + base64.RawURLEncoding.EncodeToString(sum[:digestLen]) + "}:ip"
	for _, tc := range []struct {
		name    string
		backend backend.Backend
		want    string
	}{
		{"memory store", store, "ip\x00192.0.2.1"},
		{"a backend that hashes keys", &hashingBackend{hashes: true}, "ip\x00192.0.2.1"},
		{"a backend that says it does not", &hashingBackend{hashes: false}, digested},
		{"a backend that does not say", &scripted{}, digested},
	} {
		l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1, Period: time.Second}},
			WithBackend(tc.backend), WithLogger(slog.New(slog.DiscardHandler)))
		if got := l.request(&l.rules[0], "192.0.2.1").Key; got != tc.want {
			t.Errorf("%s: stored key %q, want %q", tc.name, got, tc.want)
		}
		l.Close()
	}
}

// On the memory store a stored key is built in the pooled per-request state
// without an allocation, and that state serves the next decisions: a
// concurrency slot held past its decision must keep its own key, so that
// Release gives back this slot and not the one of whichever key reused
// the state (keys of equal length, so a shared buffer would alias exactly).
func TestHeldSlotKeepsItsKeyWhileTheStateIsReused(t *testing.T) {
	l := MustNew([]Rule{{Name: "exports", Limit: 1, Period: time.Minute, Algorithm: Concurrency}})
	defer l.Close()
	ctx := context.Background()
	decide := func(key string) Decision {
		t.Helper()
		d, err := l.Decide(ctx, Input{Rule: "exports", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := decide("tenant-a")
	if !a.Allowed {
		t.Fatal("tenant-a's first export was refused")
	}
	if d := decide("tenant-a"); d.Allowed {
		t.Fatal("tenant-a's second export was admitted while its first holds the only slot")
	}
	for i := range 100 {
		b := decide("tenant-b")
		if !b.Allowed {
			t.Fatalf("tenant-b's export %d was refused: its slot was not given back", i)
		}
		b.Release()
	}
	a.Release()
	if d := decide("tenant-a"); !d.Allowed {
		t.Fatal("tenant-a's slot was not given back by Release: the held key changed under it")
	} else {
		d.Release()
	}
}
