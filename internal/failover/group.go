package failover

import "sync"

// Group runs the engine's background goroutines (the prober, the probe
// that confirms a timeout, the charge after one, the resend loop) and
// stops them: after Stop no new one starts, and Stop waits for those that
// run. The zero value is not ready: use NewGroup.
type Group struct {
	mu      sync.Mutex
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// NewGroup returns a running Group.
func NewGroup() *Group { return &Group{stop: make(chan struct{})} }

// Go runs f on a goroutine of its own, unless the group is stopped; it
// reports whether f runs.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Stopping is closed once Stop is called: a goroutine of the group returns
// when it is.
func (g *Group) Stopping() <-chan struct{} { return g.stop }

// Stop stops the group and waits for its goroutines. It is idempotent.
func (g *Group) Stop() {
	g.mu.Lock()
	if !g.stopped {
		g.stopped = true
		close(g.stop)
	}
	g.mu.Unlock()
	g.wg.Wait()
}
