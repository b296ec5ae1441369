package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lineLog keeps the messages it is given: a slog handler, and a go-redis
// logger (redis.SetLogger's interface).
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *lineLog) Printf(_ context.Context, format string, v ...any) {
	l.add(fmt.Sprintf(format, v...))
}

func (l *lineLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *lineLog) Handle(_ context.Context, r slog.Record) error {
	l.add(r.Message)
	return nil
}
func (l *lineLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lineLog) WithGroup(string) slog.Handler      { return l }

// has reports whether a line holds what.
func (l *lineLog) has(what string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, what) {
			return true
		}
	}
	return false
}

// TestStoreLeavesTheProgramsGoRedisLogger: a program sets its go-redis
// logger, then builds a limiter on a Redis store, and Redis dies. The
// program's logger still gets go-redis's own lines (the store never calls
// redis.SetLogger), and the limiter's logger gets the degradation and the
// store's own account of the failed dials.
func TestStoreLeavesTheProgramsGoRedisLogger(t *testing.T) {
	mine := &lineLog{}
	redis.SetLogger(mine)
	defer redis.SetLogger(&lineLog{}) // later tests' lines go nowhere
	inst := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: inst.Addr, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	limiterLogs := &lineLog{}
	l, err := New([]Rule{{Name: "r", Limit: 10, Period: time.Minute}},
		WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix(redistest.KeyPrefix(t)))),
		WithLogger(slog.New(limiterLogs)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	inst.Kill()
	for range 20 {
		if _, err := l.Decide(context.Background(), Input{Rule: "r", Key: "k"}); err != nil {
			t.Fatal(err) // the rule fails open
		}
	}
	if !mine.has("failed to dial") {
		t.Errorf("the program's go-redis logger got %q, want go-redis's failed dials", mine.lines)
	}
	if !limiterLogs.has("ceiling: backend degraded") {
		t.Errorf("the limiter's logger got %q, want the degradation", limiterLogs.lines)
	}
	if !limiterLogs.has("ceiling/backend/redis: failed to dial") {
		t.Errorf("the limiter's logger got %q, want the store's failed dials", limiterLogs.lines)
	}
}
