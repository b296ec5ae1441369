package backend

// Evicting is implemented by a backend that may forget a key's spent units
// to stay within a bound on its memory, as the memory store does at its
// key cap. Each such eviction gives a caller quota back: a limit enforced
// less strictly than configured, which the limiter reports in its health
// report and to its observer.
type Evicting interface {
	// Evictions returns how many keys holding spent units (not back to
	// full) the backend has evicted since it was created.
	Evictions() uint64
}
