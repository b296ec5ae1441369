package memory

import "time"

// janitor sweeps the Store every interval until Close.
func (s *Store) janitor(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep deletes every key whose state is back to full and shrinks the
// tables that emptied, one shard at a time so that decisions on other
// shards never wait for it. It returns how many keys it deleted.
func (s *Store) sweep() int {
	now := s.now()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		removed += sh.sweep(now)
		sh.mu.Unlock()
	}
	return removed
}

// sweep deletes the shard's keys that are back to full at now and records
// the earliest expiry left. The caller holds sh.mu.
func (sh *shard) sweep(now int64) int {
	g, ge := sh.gcra.sweep(now, gcraExpiry)
	w, we := sh.windows.sweep(now, windowExpiry)
	l, le := sh.logs.sweep(now, logExpiry)
	r, re := sh.rolls.sweep(now)
	c, ce := sh.leases.sweep(now, leaseExpiry)
	sh.minExp = min(ge, we, le, re, ce)
	return g + w + l + r + c
}

func gcraExpiry(st *gcraState) int64 { return st.tat }
