package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// BenchmarkChat is one admitted POST /api/chat through the whole handler
// (token check, four rules, prefetch, reply, settlement) without the
// network, for 1000 shops from 1000 addresses whose limits are never
// reached.
func BenchmarkChat(b *testing.B) {
	run := func(b *testing.B, cfg config) {
		cfg.Limits.PerMinute, cfg.Limits.PerDay, cfg.Limits.PerIP, cfg.Limits.Tokens = 1e9, 1e9, 1e9, 1e9
		h, cleanup, err := newServer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer cleanup()
		toks, addrs := make([]string, 1000), make([]string, 1000)
		for i := range toks {
			toks[i] = token(b, "https://shop-"+strconv.Itoa(i)+".myshopify.com")
			addrs[i] = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":40000"
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			r := httptest.NewRequest(http.MethodPost, "/api/chat", strings.NewReader(question))
			r.Header.Set("Authorization", "Bearer "+toks[i%len(toks)])
			r.RemoteAddr = addrs[i%len(addrs)]
			w := httptest.NewRecorder()
			h.Public.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}
	b.Run("memory", func(b *testing.B) {
		cfg, _ := testConfig(b)
		run(b, cfg)
	})
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Shared(b)
		cfg, _ := testConfig(b)
		cfg.RedisURL = "redis://" + srv.Addr + "/0"
		cfg.RedisPrefix = redistest.KeyPrefix(b)
		run(b, cfg)
	})
}
