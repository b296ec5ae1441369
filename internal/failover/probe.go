package failover

import (
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// While the breaker is open, one goroutine per limiter probes the backend,
// so that recovery needs no traffic: an idle instance whose health check
// is a readiness probe would otherwise stay out of rotation forever.

// NewCanary is the probe's request: a real decision (so a backend that
// answers but cannot write, read-only or out of memory, fails it) on a key
// of its own that no rule's stored key can equal (those end in a 22-byte
// digest), limited so high that it is never rejected, with a one-second
// period so that the backend forgets it at once.
func NewCanary() backend.Request {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return backend.Request{
		Key:       "ceiling-probe:" + hex.EncodeToString(id[:]),
		Algorithm: backend.FixedWindow,
		Limit:     backend.MaxLimit,
		Period:    time.Second,
		Cost:      1,
	}
}

// Prober runs the probe loop of a Breaker while it is open.
type Prober struct {
	Breaker     *Breaker
	Group       *Group
	CoolDown    time.Duration // the interval after the first probe, before doubling
	MaxCoolDown time.Duration
	// Probe asks the backend and reports why it cannot be trusted yet, or
	// nil; Recovered runs once it answered, before the breaker closes, and
	// Closed after.
	Probe     func() error
	Recovered func()
	Closed    func()

	running atomic.Bool
}

// Start starts the probe loop unless one runs; the breaker calls it when
// it opens.
func (p *Prober) Start() {
	if !p.running.CompareAndSwap(false, true) {
		return
	}
	if !p.Group.Go(p.loop) {
		p.running.Store(false)
	}
}

// loop probes the backend until it answers (and closes the breaker) or the
// group stops. The first probe goes when the opening said it would; the
// interval doubles while probes fail, up to the maximum, and every wait is
// jittered.
func (p *Prober) loop() {
	b := p.Breaker
	interval := p.CoolDown
	t := time.NewTimer(b.FirstProbe())
	defer t.Stop()
	for {
		select {
		case <-p.Group.Stopping():
			p.running.Store(false)
			return
		case <-t.C:
		}
		err := p.Probe()
		if err == nil {
			p.Recovered()
			p.running.Store(false)
			b.Close()
			p.Closed()
			return
		}
		interval = min(2*interval, p.MaxCoolDown)
		wait := Jittered(interval)
		b.Probed(err, wait)
		t.Reset(wait)
	}
}
