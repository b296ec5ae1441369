package redis

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
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

// TestStoreLogsWhatItSees decides against a dead server: every decision
// fails to dial. The Store logs the failed dials to its slog logger, one
// line standing for many, and leaves go-redis's own logger alone: the
// program's go-redis logger still gets go-redis's own lines.
func TestStoreLogsWhatItSees(t *testing.T) {
	goRedis := &records{}
	redis.SetLogger(goRedisLogger{slog.New(goRedis)})
	defer redis.SetLogger(goRedisLogger{slog.New(slog.DiscardHandler)})

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
	dials := storeLines(logs, "failed to dial")
	if len(dials) != 1 {
		t.Fatalf("%d dial records for %d failed dials, want 1 (sampled): %v", len(dials), n, logs.get())
	}
	if recs := goRedis.get(); len(recs) == 0 || !strings.Contains(recs[0].Message, "failed to dial") {
		t.Errorf("the program's go-redis logger got %v, want go-redis's own failed dials", recs)
	}
	// The next minute, one more line, standing for what it held back.
	l := s.logs.Load()
	for i := range l.samplers {
		l.samplers[i].next.Store(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.Decide(ctx, []backend.Request{day("k", 1)})
	cancel()
	dials = storeLines(logs, "failed to dial")
	if len(dials) != 2 {
		t.Fatalf("%d dial records after the sampling interval, want 2", len(dials))
	}
	var occ int64
	dials[1].Attrs(func(a slog.Attr) bool {
		if a.Key == "occurrences" {
			occ = a.Value.Int64()
		}
		return true
	})
	if occ != n {
		t.Errorf("second line stands for %d lines, want %d (the %d held back and itself)", occ, n, n-1)
	}
}

// storeLines returns the Store's records whose message holds what.
func storeLines(r *records, what string) []slog.Record {
	var lines []slog.Record
	for _, rec := range r.get() {
		if strings.HasPrefix(rec.Message, "ceiling/backend/redis: ") && strings.Contains(rec.Message, what) {
			lines = append(lines, rec)
		}
	}
	return lines
}

// dialCount counts a client's failed dials (redis.Hook).
type dialCount struct{ failed atomic.Int64 }

func (d *dialCount) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			d.failed.Add(1)
		}
		return c, err
	}
}
func (d *dialCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// goRedisLines returns the Store's records of failed dials.
func goRedisLines(r *records) []slog.Record { return storeLines(r, "failed to dial") }

// TestLimiterLoggerGetsTheStoresLines builds limiters with
// ceiling.WithLogger, as the README shows, over Stores on a client of a
// closed loopback port. A Store built without a logger of its own logs its
// client's failed dials to the limiter's logger (slog.Default() for a
// limiter without WithLogger), sampled; one built with WithLogger keeps
// its own; one built with WithLogger(nil) logs nothing.
func TestLimiterLoggerGetsTheStoresLines(t *testing.T) {
	rules := []ceiling.Rule{{Name: "r", Limit: 10, Period: time.Minute}}
	// decide makes 5 decisions through a limiter logging to logs (nil: the
	// limiter's default), on a Store built with opts, and returns the
	// Store's client's failed dials.
	decide := func(t *testing.T, logs *records, opts ...Option) int64 {
		client := redis.NewClient(&redis.Options{Addr: closedAddr(t), DialerRetries: 1, PoolSize: 100})
		t.Cleanup(func() { client.Close() })
		dials := &dialCount{}
		client.AddHook(dials)
		lopts := []ceiling.Option{ceiling.WithBackend(New(client, opts...))}
		if logs != nil {
			lopts = append(lopts, ceiling.WithLogger(slog.New(logs)))
		}
		l, err := ceiling.New(rules, lopts...)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 5 {
			if _, err := l.Decide(context.Background(), ceiling.Input{Rule: "r", Key: "k"}); err != nil {
				t.Fatal(err) // the rule fails open
			}
		}
		return dials.failed.Load()
	}

	t.Run("limiter's", func(t *testing.T) {
		logs := &records{}
		dials := decide(t, logs, WithDenyCache(0))
		lines := goRedisLines(logs)
		if dials < 2 || len(lines) != 1 {
			t.Fatalf("%d dial records in the limiter's logger for %d failed dials, want 1 (sampled) for at least 2: %v", len(lines), dials, lines)
		}
		occurrences := int64(-1)
		lines[0].Attrs(func(a slog.Attr) bool {
			if a.Key == "occurrences" {
				occurrences = a.Value.Int64()
			}
			return true
		})
		if occurrences != 1 {
			t.Errorf("record %q with occurrences %d, want the first failed dial of its kind", lines[0].Message, occurrences)
		}
	})
	t.Run("default", func(t *testing.T) {
		logs := &records{}
		old, w, flags := slog.Default(), log.Writer(), log.Flags()
		slog.SetDefault(slog.New(logs))
		defer func() {
			slog.SetDefault(old)
			log.SetOutput(w)
			log.SetFlags(flags)
		}()
		decide(t, nil, WithDenyCache(0))
		if n := len(goRedisLines(logs)); n != 1 {
			t.Errorf("%d dial records in slog.Default() of a limiter without WithLogger, want 1", n)
		}
	})
	t.Run("store's own", func(t *testing.T) {
		limiterLogs, storeLogs := &records{}, &records{}
		decide(t, limiterLogs, WithDenyCache(0), WithLogger(slog.New(storeLogs)))
		if n := len(goRedisLines(storeLogs)); n != 1 {
			t.Errorf("%d dial records in the Store's own logger, want 1", n)
		}
		if lines := goRedisLines(limiterLogs); len(lines) != 0 {
			t.Errorf("the limiter's logger got the lines of a Store with a logger of its own: %v", lines)
		}
	})
	t.Run("none", func(t *testing.T) {
		logs := &records{}
		decide(t, logs, WithDenyCache(0), WithLogger(nil))
		if lines := goRedisLines(logs); len(lines) != 0 {
			t.Errorf("the limiter's logger got the lines of a Store built with WithLogger(nil): %v", lines)
		}
	})
}

// goRedisLogger is a user's go-redis logger: every line to its slog logger.
type goRedisLogger struct{ l *slog.Logger }

func (g goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	g.l.Info(fmt.Sprintf(format, v...))
}
