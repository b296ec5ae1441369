package ceiling

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// With a key secret, the stored key is the first 16 bytes of the HMAC-SHA256
// of "rule\x00value". A short value must not shorten the digest: before the
// fix only len(value) bytes of the MAC were kept and the rest were zeros, so
// user ids "17" and "42" kept 16 bits each and collided easily.
func TestKeySecretDigestKeepsSixteenBytesOfShortValuesRegression(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	l := MustNew([]Rule{{Name: "user", Key: Static("x"), Limit: 1, Period: time.Second}}, WithKeySecret(secret), WithBackend(&scripted{}))
	for _, v := range []string{"", "7", "42", "10.0.0.1", "+254700000000", "a-user-id-longer-than-thirty-two-bytes-0123456789"} {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte("user\x00" + v))
		want := "user:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:digestLen])
		if got := l.request(&l.rules[0], v).Key; got != want {
			t.Errorf("stored key of %q = %q, want %q", v, got, want)
		}
	}
}

// TestStoredDigestsAreUnlinkableAcrossRules pins issue 14's eighth finding:
// one address under chat:ip and otp:ip (two services sharing a Redis) has
// unrelated digests, with a secret or without, while each rule's key for it
// is stable.
func TestStoredDigestsAreUnlinkableAcrossRules(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	for _, opts := range [][]Option{nil, {WithKeySecret(secret)}} {
		opts = append(opts, WithBackend(&scripted{}), WithLogger(slog.New(slog.DiscardHandler)))
		chat := MustNew([]Rule{{Name: "chat:ip", Key: RemoteAddr, Limit: 1, Period: time.Second}}, opts...)
		otp := MustNew([]Rule{{Name: "otp:ip", Key: RemoteAddr, Limit: 1, Period: time.Second}}, opts...)
		digest := func(l *Limiter, v string) string {
			_, d, _ := strings.Cut(l.request(&l.rules[0], v).Key, ":ip:")
			return d
		}
		for _, addr := range []string{"192.0.2.1", "2001:db8:1:2::/64"} {
			c, o := digest(chat, addr), digest(otp, addr)
			if c == o || len(c) != 22 || len(o) != 22 {
				t.Errorf("%s: digests %q (chat:ip) and %q (otp:ip), want two unrelated 22-character digests", addr, c, o)
			}
			if again := digest(chat, addr); again != c {
				t.Errorf("%s: chat:ip digest %q then %q, want it stable", addr, c, again)
			}
		}
		// Without a secret the digest is SHA-256 of "rule\x00value": pinned,
		// since a change moves every stored key.
		if len(opts) == 2 {
			sum := sha256.Sum256([]byte("otp:ip\x00192.0.2.1"))
			if got, want := digest(otp, "192.0.2.1"), base64.RawURLEncoding.EncodeToString(sum[:digestLen]); got != want {
				t.Errorf("otp:ip digest of 192.0.2.1 = %q, want %q", got, want)
			}
		}
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
	sum := sha256.Sum256([]byte("ip\x00192.0.2.1"))
	digested := "ip:" + base64.RawURLEncoding.EncodeToString(sum[:digestLen])
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
