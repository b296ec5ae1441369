package backendtest

import (
	"sync"
	"time"
)

// Epoch is the instant every [Run] subtest starts its clock at: a UTC
// midnight, so windows of any period that divides a day start exactly at
// Epoch and the suite's hand-computed tables stay readable.
var Epoch = time.Unix(1_699_920_000, 0)

// Clock is a fake clock whose time moves only when told to. Its Now method
// is what [Run] hands to a backend as its time source.
//
// The zero value reads as the zero time; use [NewClock]. A Clock is safe for
// simultaneous use by multiple goroutines.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (backwards too, which backends must survive).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
