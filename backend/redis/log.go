package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	logger   *slog.Logger
	samplers [len(kinds) + 3]sampler // kinds, then "error", "timeout" and "dial"
}

func newStoreLog(logger *slog.Logger) *storeLog { return &storeLog{logger: logger} }

// Sampler indices past kinds'.
const (
	kindError = len(kinds) + iota
	kindTimeout
	kindDial
)

// warn logs msg, sampled per kind; l may be nil (no logger).
func (l *storeLog) warn(kind int, msg string) {
	if l == nil {
		return
	}
	if ok, n := l.samplers[kind].allow(time.Now()); ok {
		l.logger.LogAttrs(context.Background(), slog.LevelWarn, "ceiling/backend/redis: "+msg, slog.Int64("occurrences", n))
	}
}

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

var kinds = [...]error{backend.ErrUnreachable, backend.ErrAuth, backend.ErrReadOnly, backend.ErrOutOfMemory}

// logReply logs an error of one of the Store's commands, sampled by kind;
// a command its callers cancelled says nothing about Redis.
func (s *Store) logReply(err error) {
	l := s.logs.Load()
	if l == nil || err == nil || errors.Is(err, context.Canceled) {
		return
	}
	err = classify(err)
	kind := kindError
	for i, k := range kinds {
		if errors.Is(err, k) {
			kind = i
			break
		}
	}
	if timedOut(err) {
		kind = kindTimeout
	}
	l.warn(kind, fmt.Sprintf("command failed: %v", err))
}
