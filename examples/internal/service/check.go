package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
)

// checkTimeout bounds the start-up check: a misconfigured Redis is told
// within seconds.
const checkTimeout = 5 * time.Second

// Check runs the limiter's start-up check (ceiling.Limiter.Check). A
// misconfigured backend refuses the start with an error naming the cause: a
// wrong or missing password, a read-only replica, a full Redis (maxmemory
// with noeviction), a backend that does not enforce. An unreachable or slow
// backend is an outage, which the fail mode handles: with startDegraded
// (a service whose rules fail open or local) the service starts degraded,
// logged at ERROR and reported by /healthz, and recovers by itself once
// Redis answers; without it (rules that fail closed would answer only
// 503s) it refuses to start as well.
func Check(l *ceiling.Limiter, logger *slog.Logger, startDegraded bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	err := l.Check(ctx)
	if err == nil {
		return nil
	}
	outage := errors.Is(err, backend.ErrUnreachable) || errors.Is(err, ceiling.ErrTimeout) ||
		errors.Is(err, backend.ErrNotSent) || errors.Is(err, backend.ErrUnread)
	if outage && startDegraded {
		logger.Error("the limiter's backend cannot be reached at start: starting DEGRADED (the fail mode decides until it answers)",
			slog.Any("err", err))
		return nil
	}
	if outage {
		return fmt.Errorf("the limiter's backend cannot be reached, and the rules fail closed: %w", err)
	}
	return fmt.Errorf("the limiter's backend is misconfigured: %w", err)
}
