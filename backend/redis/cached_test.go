package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestDecideCachedAnswersWithoutRedis spends a key, then kills Redis:
// DecideCached still refuses the key from the deny cache, as Decide did
// (Cached, counting its RetryAfter down), and has no answer for a key it
// never saw refused; with the deny cache off it never answers.
func TestDecideCachedAnswersWithoutRedis(t *testing.T) {
	inst := redistest.Server(t)
	s := New(defaultClient(t, inst.Addr), WithPrefix(redistest.KeyPrefix(t)))
	off := New(defaultClient(t, inst.Addr), WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	limited := backend.Request{Key: "spent", Limit: 1, Period: time.Minute, Cost: 1}
	decide(t, s, limited)
	refused := decide(t, s, limited)[0]
	if refused.Allowed || refused.Cached {
		t.Fatalf("second of 1 per minute: %+v, want refused by Redis", refused)
	}
	decide(t, off, backend.Request{Key: "spent-off", Limit: 1, Period: time.Minute, Cost: 1})
	decide(t, off, backend.Request{Key: "spent-off", Limit: 1, Period: time.Minute, Cost: 1})
	inst.Kill()

	out := make([]backend.Result, 2)
	fresh := backend.Request{Key: "fresh", Limit: 1, Period: time.Minute, Cost: 1}
	if !s.DecideCached([]backend.Request{fresh, limited}, out) {
		t.Fatal("a spent key, Redis killed: no answer from the deny cache")
	}
	if got := out[1]; got.Allowed || !got.Cached || got.RetryAfter <= 0 || got.RetryAfter > refused.RetryAfter {
		t.Errorf("the spent key: %+v, want refused from the cache, RetryAfter in (0, %v]", got, refused.RetryAfter)
	}
	if got := out[0]; !got.Allowed || !got.Unread || !got.Cached {
		t.Errorf("the other key of the call: %+v, want unread", got)
	}
	if s.DecideCached([]backend.Request{fresh}, out) {
		t.Errorf("a key never refused: answered %+v", out[0])
	}
	if off.DecideCached([]backend.Request{{Key: "spent-off", Limit: 1, Period: time.Minute, Cost: 1}}, out) {
		t.Error("deny cache off: answered")
	}
}
