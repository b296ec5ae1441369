package redis_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestStoredKeysHoldNoRawValue sends requests through ceiling's middleware
// onto a Redis Cluster, keyed by a header a caller controls, and reads back
// every stored key: prefix:{tag}:rule, the tag a digest of the value, with
// no trace of the value, and no user-supplied {…} hash tag deciding the
// slot.
func TestStoredKeysHoldNoRawValue(t *testing.T) {
	cluster := redistest.SharedCluster(t)
	client := cluster.Client(t)
	prefix := redistest.KeyPrefix(t)
	limiter, err := ceiling.New([]ceiling.Rule{
		{Name: "otp:to", Key: ceiling.Header("X-Phone"), Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog},
	}, ceiling.WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix(prefix))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { limiter.Close() })
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	values := []string{"+15551234567", "{tag}+15551234567", "{x}", "a{b}c"}
	var codes []int
	for _, v := range values {
		for range 4 {
			r := httptest.NewRequest("POST", "/otp", nil)
			r.Header.Set("X-Phone", v)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			codes = append(codes, w.Code)
		}
	}
	for i, code := range codes {
		if want := []int{200, 200, 200, 429}[i%4]; code != want {
			t.Fatalf("statuses %v: request %d got %d, want %d (each value its own limit)", codes, i, code, want)
		}
	}

	ctx := context.Background()
	var stored []string
	var mu sync.Mutex
	var nodes []*redis.Client
	if err := client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		mu.Lock() // ForEachMaster calls this concurrently
		defer mu.Unlock()
		nodes = append(nodes, n)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		keys, err := n.Keys(ctx, prefix+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, keys...)
	}
	if got, want := len(stored), len(values); got != want {
		t.Fatalf("stored keys %v: %d, want %d", stored, got, want)
	}
	length := len(stored[0])
	for _, k := range stored {
		tag := tagOf(k)
		if !strings.HasPrefix(k, prefix+":{") || !strings.HasSuffix(k, "}:otp:to") || len(tag) != 22 {
			t.Errorf("stored key %q does not read prefix:{tag}:rule", k)
		}
		if len(k) != length {
			t.Errorf("stored keys of different lengths: %q and %q", k, stored[0])
		}
		if strings.ContainsAny(tag, "{}+") || strings.Contains(k, "5551234567") {
			t.Errorf("stored key %q holds raw input", k)
		}
		for _, n := range nodes {
			value, err := n.Get(ctx, k).Result()
			if err == nil && strings.Contains(value, "5551234567") {
				t.Errorf("value of %q holds the raw phone number: %q", k, value)
			}
		}
	}
}
