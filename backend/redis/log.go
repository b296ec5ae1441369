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

// logEvery is how often a Store logs a line of the same kind at most; the
// line it logs says how many it stands for.
const logEvery = time.Minute

// WithLogger makes logger the Store's logger for what it sees of Redis
// (failed dials of its client, error replies to its scripts), at level
// Warn, sampled: the first line of each kind at once, then at most one a
// minute with the number of lines it stands for ("occurrences"), so that
// an outage is a few lines, not one per decision.
//
// A Store built without WithLogger takes the logger of the first limiter
// built on it (ceiling.WithLogger, or slog.Default), which ceiling.New
// passes to [Store.UseDefaultLogger]; one built with WithLogger keeps its
// own, and WithLogger(nil) logs nothing.
//
// go-redis's own log lines are not the Store's: they go wherever the
// program's go-redis logger sends them (redis.SetLogger, or go-redis's
// default on stderr). The Store never replaces that process-wide logger.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = logger, true }
}

// UseDefaultLogger makes logger the Store's logger (see [WithLogger])
// unless the Store has one or was built with WithLogger: a Store keeps
// the first logger it gets. ceiling.New calls it with the limiter's
// logger, as [backend.DefaultLogger] asks, so that limiter and store log
// to one place. A nil logger does nothing.
func (s *Store) UseDefaultLogger(logger *slog.Logger) {
	if logger == nil || s.ownLogs || s.logs.Load() != nil {
		return
	}
	s.logs.CompareAndSwap(nil, newStoreLog(logger))
}

// storeLog is a Store's logger and its samplers, one per kind of line.
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

// maxKinds bounds the samplers of a Store: the kinds are the fixed set of
// failures classify names, and dials.
const maxKinds = 16

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

// kinds are the kinds of failure a logged error is sampled by.
var kinds = []error{backend.ErrUnreachable, backend.ErrAuth, backend.ErrReadOnly, backend.ErrOutOfMemory}

// logReply logs the error reply of one of the Store's commands, sampled by
// its kind. A command cancelled because its callers gave up says nothing
// about Redis, and is not logged.
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
