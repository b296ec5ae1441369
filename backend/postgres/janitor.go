package postgres

import (
	"context"
	"time"
)

// janitorSQL deletes at most $2 rows whose state was back to full at $1
// (NULL: the server's clock), skipping rows a decision holds, and at most
// $2 settlement records expired by then (its row count is the states').
const janitorSQL = `WITH settled AS (DELETE FROM ceiling_settled WHERE (key, once) IN (
  SELECT key, once FROM ceiling_settled
  WHERE expires <= coalesce($1, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
  ORDER BY expires LIMIT $2 FOR UPDATE SKIP LOCKED))
DELETE FROM ceiling_state WHERE key IN (
  SELECT key FROM ceiling_state
  WHERE expires <= coalesce($1, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint) AND alg >= 0
  ORDER BY expires LIMIT $2 FOR UPDATE SKIP LOCKED)`

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
		tag, err := s.pool.Exec(ctx, janitorSQL, s.now(), batch)
		if err != nil {
			return total
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	return total
}
