package redis

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// logEvery is how often a Store logs the same go-redis line at most; the
// line it logs says how many it stands for.
const logEvery = time.Minute

// WithLogger sends go-redis's own log lines about this Store's calls and
// its client's connections to logger at level Warn, sampled: the first of
// each kind at once, then at most one a minute with the number of lines it
// stands for ("occurrences"). Without a logger, go-redis writes a line to
// stderr, in its own format, for every failed dial ("failed to dial after
// 5 attempts"): a flood while Redis is down.
//
// A Store built without WithLogger takes the logger of the first limiter
// built on it (ceiling.WithLogger, or slog.Default), which ceiling.New
// passes to [Store.UseDefaultLogger]; one built with WithLogger keeps its
// own. WithLogger(nil) leaves go-redis's lines about the Store where
// go-redis writes them, and installs nothing.
//
// go-redis has one logger per process (redis.SetLogger). The first Store
// that gets a logger installs a router as that logger: lines logged while
// serving a call of a Store with a logger, and lines about a failed dial
// of its client (whoever's command the dial was for, when you share the
// client), go to that Store's logger; every other line (your own
// commands', go-redis's background work's) is written as go-redis writes
// it by default, to stderr. A logger you set with redis.SetLogger before
// that is replaced; one you set after replaces the router, and the Stores'
// lines go to yours unsampled.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = logger, true }
}

// UseDefaultLogger makes logger the Store's logger for go-redis's lines
// (see [WithLogger]) unless the Store has one or was built with
// WithLogger: a Store keeps the first logger it gets. ceiling.New calls it
// with the limiter's logger, as [backend.DefaultLogger] asks, so that
// limiter and store log to one place. A nil logger does nothing.
func (s *Store) UseDefaultLogger(logger *slog.Logger) {
	if logger == nil || s.ownLogs || s.logs.Load() != nil {
		return
	}
	s.logs.CompareAndSwap(nil, newStoreLog(logger))
}

// logKey marks a context as a call of a Store with a logger.
type logKey struct{}

// logContext marks ctx as a call of s, for go-redis's log lines.
func (s *Store) logContext(ctx context.Context) context.Context {
	l := s.logs.Load()
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, logKey{}, l)
}

// storeLog is a Store's logger and its samplers, one per kind of line
// (go-redis's format string).
type storeLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	kinds  map[string]*sampler
}

func newStoreLog(logger *slog.Logger) *storeLog {
	installRouter.Do(func() { redis.SetLogger(router{}) })
	return &storeLog{logger: logger, kinds: map[string]*sampler{}}
}

func (l *storeLog) printf(format string, v ...any) {
	l.mu.Lock()
	sm := l.kinds[format]
	if sm == nil {
		if len(l.kinds) >= maxKinds {
			l.mu.Unlock()
			return
		}
		sm = &sampler{}
		l.kinds[format] = sm
	}
	l.mu.Unlock()
	if ok, n := sm.allow(time.Now()); ok {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: go-redis: "+fmt.Sprintf(format, v...),
			slog.Int64("occurrences", n))
	}
}

// maxKinds bounds the samplers of a Store: go-redis's format strings are a
// fixed set, far fewer.
const maxKinds = 64

// sampler lets one event through per logEvery and counts the others.
type sampler struct {
	next atomic.Int64 // UnixNano before which events are held back
	held atomic.Int64 // events since the last one let through
}

// allow counts an event and reports whether to log it, with the number of
// events the line stands for.
func (s *sampler) allow(now time.Time) (bool, int64) {
	n := s.held.Add(1)
	t := now.UnixNano()
	next := s.next.Load()
	if t < next || !s.next.CompareAndSwap(next, t+int64(logEvery)) {
		return false, 0
	}
	return true, max(n, s.held.Swap(0))
}

var installRouter sync.Once

// fallback writes the lines of calls of no Store with a logger as
// go-redis's default logger does.
var fallback = log.New(defaultStderr, "redis: ", log.LstdFlags|log.Lshortfile)

var defaultStderr = os.Stderr

// router is go-redis's process-wide logger once a Store has WithLogger.
type router struct{}

// fallbackDepth makes log.Lshortfile name the go-redis line that logged:
// router.Printf is called through go-redis's own forwarding Printf.
const fallbackDepth = 3

func (router) Printf(ctx context.Context, format string, v ...any) {
	if ctx != nil {
		if l, ok := ctx.Value(logKey{}).(*storeLog); ok {
			l.printf(format, v...)
			return
		}
	}
	for _, a := range v {
		var de *dialError
		if err, ok := a.(error); ok && errors.As(err, &de) {
			de.logs.printf(format, v...)
			return
		}
	}
	fallback.Output(fallbackDepth, fmt.Sprintf(format, v...))
}
