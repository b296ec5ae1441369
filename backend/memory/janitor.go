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
		removed += sh.gcra.sweep(now, gcraExpiry)
		removed += sh.windows.sweep(now, windowExpiry)
		removed += sh.logs.sweep(now, logExpiry)
		sh.mu.Unlock()
	}
	return removed
}

func gcraExpiry(tat *int64) int64 { return *tat }
