package bench

import (
	"sync"
	"testing"
)

// A sub-benchmark's function runs once per round of b.N (RunParallel has
// no b.Loop); setups keeps its checked, filled fixture across the rounds,
// keyed by the benchmark's name, and releases them all when the top-level
// benchmark ends.
var setups struct {
	sync.Mutex
	m map[string]any
}

// setup returns the fixture for b's name, building it with build the
// first time. Closers registered by build run when top ends.
func setup[T any](b *testing.B, top *testing.B, build func() T) T {
	b.Helper()
	setups.Lock()
	defer setups.Unlock()
	if setups.m == nil {
		setups.m = make(map[string]any)
	}
	if v, ok := setups.m[b.Name()]; ok {
		return v.(T)
	}
	v := build()
	setups.m[b.Name()] = v
	name := b.Name()
	top.Cleanup(func() {
		setups.Lock()
		delete(setups.m, name)
		setups.Unlock()
	})
	return v
}
