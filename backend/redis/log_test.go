package redis

import (
	"bytes"
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
	for _, sm := range s.logs.Load().kinds {
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

// goRedisLines returns the records of go-redis's lines.
func goRedisLines(r *records) []slog.Record {
	var lines []slog.Record
	for _, rec := range r.get() {
		if strings.Contains(rec.Message, "go-redis: ") {
			lines = append(lines, rec)
		}
	}
	return lines
}

// TestLimiterLoggerGetsGoRedisLines builds limiters with ceiling.WithLogger,
// as the README shows, over Stores on a client of a closed loopback port.
// A Store built without a logger of its own sends go-redis's failed dials
// to the limiter's logger (slog.Default() for a limiter without
// WithLogger), sampled, and nothing to stderr; one built with
// WithLogger keeps its own; one built with WithLogger(nil) leaves them to
// go-redis's default place.
func TestLimiterLoggerGetsGoRedisLines(t *testing.T) {
	var stderr syncBuffer
	fallback.SetOutput(&stderr)
	defer fallback.SetOutput(defaultStderr)
	rules := []ceiling.Rule{{Name: "r", Limit: 10, Period: time.Minute}}
	// decide makes 5 decisions through a limiter logging to logs (nil: the
	// limiter's default), on a Store built with opts, and returns the
	// Store's client's failed dials. then, if not nil, runs once the
	// limiter is built.
	var then func()
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
		if then != nil {
			then()
		}
		for range 5 {
			if _, err := l.Decide(context.Background(), ceiling.Input{Rule: "r", Key: "k"}); err != nil {
				t.Fatal(err) // the rule fails open
			}
		}
		return dials.failed.Load()
	}

	t.Run("limiter's", func(t *testing.T) {
		stderr.Reset()
		logs := &records{}
		dials := decide(t, logs, WithDenyCache(0))
		lines := goRedisLines(logs)
		if dials < 2 || len(lines) != 1 {
			t.Fatalf("%d go-redis records in the limiter's logger for %d failed dials, want 1 (sampled) for at least 2: %v", len(lines), dials, lines)
		}
		occurrences := int64(-1)
		lines[0].Attrs(func(a slog.Attr) bool {
			if a.Key == "occurrences" {
				occurrences = a.Value.Int64()
			}
			return true
		})
		if !strings.Contains(lines[0].Message, "failed to dial") || occurrences != 1 {
			t.Errorf("record %q with occurrences %d, want go-redis's failed dial, the first of its kind", lines[0].Message, occurrences)
		}
		if got := stderr.String(); got != "" {
			t.Errorf("go-redis wrote to stderr too:\n%s", got)
		}
	})
	t.Run("default", func(t *testing.T) {
		stderr.Reset()
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
			t.Errorf("%d go-redis records in slog.Default() of a limiter without WithLogger, want 1", n)
		}
		if got := stderr.String(); got != "" {
			t.Errorf("go-redis wrote to stderr too:\n%s", got)
		}
	})
	t.Run("store's own", func(t *testing.T) {
		stderr.Reset()
		limiterLogs, storeLogs := &records{}, &records{}
		decide(t, limiterLogs, WithDenyCache(0), WithLogger(slog.New(storeLogs)))
		if n := len(goRedisLines(storeLogs)); n != 1 {
			t.Errorf("%d go-redis records in the Store's own logger, want 1", n)
		}
		if lines := goRedisLines(limiterLogs); len(lines) != 0 {
			t.Errorf("the limiter's logger got the lines of a Store with a logger of its own: %v", lines)
		}
		if got := stderr.String(); got != "" {
			t.Errorf("go-redis wrote to stderr too:\n%s", got)
		}
	})
	t.Run("redis.SetLogger after", func(t *testing.T) {
		stderr.Reset()
		limiterLogs, mine := &records{}, &records{}
		then = func() { redis.SetLogger(goRedisLogger{slog.New(mine)}) }
		defer func() {
			then = nil
			redis.SetLogger(router{}) // as the first Store with a logger left it
		}()
		decide(t, limiterLogs, WithDenyCache(0))
		if lines := goRedisLines(limiterLogs); len(lines) != 0 {
			t.Errorf("the limiter's logger got go-redis's lines after the user's redis.SetLogger: %v", lines)
		}
		if recs := mine.get(); len(recs) < 2 || !strings.Contains(recs[0].Message, "failed to dial") {
			t.Errorf("the logger set with redis.SetLogger after the limiter got %v, want every failed dial, unsampled", recs)
		}
	})
	t.Run("none", func(t *testing.T) {
		stderr.Reset()
		logs := &records{}
		decide(t, logs, WithDenyCache(0), WithLogger(nil))
		if lines := goRedisLines(logs); len(lines) != 0 {
			t.Errorf("the limiter's logger got the lines of a Store built with WithLogger(nil): %v", lines)
		}
		if got := stderr.String(); !strings.Contains(got, "failed to dial") {
			t.Errorf("stderr = %q, want go-redis's own lines for a Store built with WithLogger(nil)", got)
		}
	})
}

// goRedisLogger is a user's go-redis logger: every line to its slog logger.
type goRedisLogger struct{ l *slog.Logger }

func (g goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	g.l.Info(fmt.Sprintf(format, v...))
}

// syncBuffer is a bytes.Buffer safe for go-redis's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}
