package main

import (
	"net/http/httptest"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"go.uber.org/goleak"
)

// cleanup stops everything newServer started: the limiter (and the memory
// store's janitor) and the Redis client's pool.
func TestCleanupLeavesNoGoroutines(t *testing.T) {
	backends(t, false, func(t *testing.T, cfg config, _ *countingSender) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		h, cleanup, err := newServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(h.Public)
		client := ts.Client()
		for range 4 {
			if _, err := servicetest.Post(client, ts.URL+"/api/otp", "", phone(kenya)); err != nil {
				t.Fatal(err)
			}
		}
		client.CloseIdleConnections()
		ts.Close()
		cleanup()
	})
}
