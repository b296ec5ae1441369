package service

import (
	"flag"
	"log/slog"
	"strings"
	"testing"
)

// TestDatabaseURLErrorHidesThePassword_Regression: pgx names a string it
// cannot parse with its password masked, but only up to the first '@': a
// password holding an unescaped '@' (or a string cut elsewhere) showed its
// tail in the start-up error. The error names DATABASE_URL and why, never
// the string.
func TestDatabaseURLErrorHidesThePassword_Regression(t *testing.T) {
	for _, url := range []string{
		"postgres://svc:hunter2@tail-secret@127.0.0.1:x/db",
		"postgres://svc:tail-secret@127.0.0.1:x/db",
		"host=127.0.0.1 password=tail-secret port=x",
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		c := Register(fs, env(map[string]string{"DATABASE_URL": url}))
		_, _, err := c.Backend(slog.New(slog.DiscardHandler), "p")
		if err == nil {
			t.Fatalf("DATABASE_URL=%q accepted", url)
		}
		if msg := err.Error(); strings.Contains(msg, "secret") || strings.Contains(msg, "hunter2") || !strings.Contains(msg, "DATABASE_URL") {
			t.Errorf("DATABASE_URL=%q: error %q, want one naming DATABASE_URL and no part of the password", url, msg)
		}
	}
}

// TestRedisURLErrorHidesThePassword_Attack: the same for REDIS_URL, whose
// parse error (backend/redis ParseURL, through net/url's) quotes the whole
// URL, password included.
func TestRedisURLErrorHidesThePassword_Attack(t *testing.T) {
	for _, url := range []string{"redis://:tail-secret@127.0.0.1:x/0", "redis://u:tail%zzsecret@127.0.0.1/0"} {
		c := Register(flag.NewFlagSet("x", flag.ContinueOnError), env(map[string]string{"REDIS_URL": url}))
		_, _, err := c.Backend(slog.New(slog.DiscardHandler), "p")
		if err == nil {
			t.Fatalf("REDIS_URL=%q accepted", url)
		}
		if msg := err.Error(); strings.Contains(msg, "secret") || !strings.Contains(msg, "REDIS_URL") {
			t.Errorf("REDIS_URL=%q: error %q, want one naming REDIS_URL and no part of the password", url, msg)
		}
	}
}
