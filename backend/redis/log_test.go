package redis

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// records is a slog handler keeping what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) get() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slog.Record(nil), r.recs...)
}

// TestGoRedisLinesGoToTheStoreLogger decides against a dead server: every
// decision makes go-redis log a failed dial. The lines of the Store's calls
// reach its slog logger, one line standing for many, and none reaches
// stderr; a line of another client goes where go-redis writes by default.
func TestGoRedisLinesGoToTheStoreLogger(t *testing.T) {
	var stderr bytes.Buffer
	fallback.SetOutput(&stderr)
	defer fallback.SetOutput(defaultStderr)

	srv := redistest.Server(t)
	srv.Kill()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, PoolSize: 100})
	t.Cleanup(func() { client.Close() })
	logs := &records{}
	s := New(client, WithLogger(slog.New(logs)), WithDenyCache(0))
	const n = 5
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err == nil {
			t.Fatal("decided on a dead server")
		}
		cancel()
	}
	recs := logs.get()
	if len(recs) != 1 {
		t.Fatalf("%d log records for %d failed dials, want 1 (sampled): %v", len(recs), n, recs)
	}
	if !strings.Contains(recs[0].Message, "failed to dial") {
		t.Errorf("record %q, want go-redis's failed dial", recs[0].Message)
	}
	if got := stderr.String(); strings.Contains(got, "failed to dial") {
		t.Errorf("go-redis wrote the Store's lines to stderr too:\n%s", got)
	}
	// Another client's line: go-redis's default place.
	other := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { other.Close() })
	other.Ping(context.Background())
	if got := stderr.String(); !strings.Contains(got, "redis: ") || !strings.Contains(got, "failed to dial") {
		t.Errorf("stderr = %q, want go-redis's own line for a call that is not the Store's", got)
	}
	// The next minute, one more line, standing for what it held back.
	for _, sm := range s.logs.kinds {
		sm.next.Store(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.Decide(ctx, []backend.Request{day("k", 1)})
	cancel()
	recs = logs.get()
	if len(recs) != 2 {
		t.Fatalf("%d records after the sampling interval, want 2", len(recs))
	}
	var occ int64
	recs[1].Attrs(func(a slog.Attr) bool {
		if a.Key == "occurrences" {
			occ = a.Value.Int64()
		}
		return true
	})
	if occ != n {
		t.Errorf("second line stands for %d lines, want %d (the %d held back and itself)", occ, n, n-1)
	}
}
