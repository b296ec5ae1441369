package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// logEvery is how often a line of one kind is logged at most.
const logEvery = time.Minute

// WithLogger sets the Store's logger for what it sees of Redis (failed
// dials, error replies), at Warn, sampled: each kind's first line at once,
// then at most one a minute with its "occurrences". Without it the Store
// takes the first limiter's logger ([Store.UseDefaultLogger]);
// WithLogger(nil) logs nothing. go-redis's own logger is never replaced.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = logger, true }
}

// UseDefaultLogger makes logger the Store's unless it has one or was built
// with WithLogger ([backend.DefaultLogger]; ceiling.New calls it).
func (s *Store) UseDefaultLogger(logger *slog.Logger) {
	if logger == nil || s.ownLogs || s.logs.Load() != nil {
		return
	}
	s.logs.CompareAndSwap(nil, newStoreLog(logger))
}

// storeLog is a Store's logger and its samplers, one per kind.
type storeLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	kinds  map[string]*sampler
}

func newStoreLog(logger *slog.Logger) *storeLog {
	return &storeLog{logger: logger, kinds: map[string]*sampler{}}
}

// warn logs msg, of kind, sampled per kind; l may be nil (no logger).
func (l *storeLog) warn(kind, msg string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	sm := l.kinds[kind]
	if sm == nil {
		if len(l.kinds) >= maxKinds {
			l.mu.Unlock()
			return
		}
		sm = &sampler{}
		l.kinds[kind] = sm
	}
	l.mu.Unlock()
	if ok, n := sm.allow(time.Now()); ok {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: "+msg, slog.Int64("occurrences", n))
	}
}

// maxKinds bounds the samplers: the kinds classify names, and dials.
const maxKinds = 16

// sampler lets one event through per logEvery and counts the others.
type sampler struct {
	next atomic.Int64 // UnixNano before which events are held back
	held atomic.Int64 // events since the last one let through
}

// allow counts an event and reports whether to log it, with the number
// of events the line stands for.
func (s *sampler) allow(now time.Time) (bool, int64) {
	n := s.held.Add(1)
	t := now.UnixNano()
	next := s.next.Load()
	if t < next || !s.next.CompareAndSwap(next, t+int64(logEvery)) {
		return false, 0
	}
	return true, max(n, s.held.Swap(0))
}

var kinds = []error{backend.ErrUnreachable, backend.ErrAuth, backend.ErrReadOnly, backend.ErrOutOfMemory}

// logReply logs an error of one of the Store's commands, sampled by kind;
// a command its callers cancelled says nothing about Redis.
func (s *Store) logReply(err error) {
	l := s.logs.Load()
	if l == nil || err == nil || errors.Is(err, context.Canceled) {
		return
	}
	err = classify(err)
	kind := "error"
	for _, k := range kinds {
		if errors.Is(err, k) {
			kind = k.Error()
			break
		}
	}
	if timedOut(err) {
		kind = "timeout"
	}
	l.warn(kind, fmt.Sprintf("command failed: %v", err))
}
