package ceiling

import "github.com/ceiling-go/ceiling/backend"

// evictions sums what the limiter's in-process stores (the backend, and
// FailLocal's store once created) evicted while keys held spent units; a
// store reports it through [backend.Evicting].
func (l *Limiter) evictions() uint64 {
	var n uint64
	if e, ok := l.backend.(backend.Evicting); ok {
		n += e.Evictions()
	}
	if ls := l.loadedLocal(); ls != nil {
		if e, ok := ls.B.(backend.Evicting); ok {
			n += e.Evictions()
		}
	}
	return n
}
