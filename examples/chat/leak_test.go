package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"go.uber.org/goleak"
)

// cleanup stops everything newServer started: the limiter (and the memory
// store's janitor), the Redis client's pool, the prefetches of requests served.
func TestCleanupLeavesNoGoroutines(t *testing.T) {
	backends(t, false, func(t *testing.T, cfg config) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		h, cleanup, err := newServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ts, admin := httptest.NewServer(h.Public), httptest.NewServer(h.Admin)
		client := ts.Client()
		tok := token(t, "https://shop-1.myshopify.com")
		for range 3 {
			if _, err := servicetest.Post(client, ts.URL+"/api/chat", tok, question); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := servicetest.Get(client, admin.URL+"/healthz"); err != nil {
			t.Fatal(err)
		}
		client.CloseIdleConnections()
		ts.Close()
		admin.Close()
		cleanup()
		http.DefaultClient.CloseIdleConnections()
	})
}
