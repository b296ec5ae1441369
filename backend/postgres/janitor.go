package postgres

import (
	"context"
	"time"
)

// janitorSQL deletes at most $2 rows whose state was back to full at $1
// (NULL: the server's clock), skipping rows a decision holds, and at most
// $2 settlement records expired by then, through the function pinned to
// ceiling's schema (decide.sql); it returns how many states it deleted.
const janitorSQL = "SELECT ceiling_sweep($1, $2)"

// janitor deletes expired rows every interval until Close, in bounded
// deletes, so that idle keys go away as Redis TTLs make them.
func (s *Store) janitor(interval time.Duration, batch int) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(batch)
		}
	}
}

// sweep runs deletes of at most batch rows until one takes fewer, at most
// ten, each bounded by the interval's context.
func (s *Store) sweep(batch int) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var total int64
	for range 10 {
		var n int64
		if err := s.pool.QueryRow(ctx, janitorSQL, s.now(), int64(batch)).Scan(&n); err != nil {
			return total
		}
		total += n
		if n < int64(batch) {
			break
		}
	}
	return total
}
