package ceiling

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// While the circuit breaker is open, one goroutine per limiter probes the
// backend, so that recovery needs no traffic: an idle instance whose health
// check is a readiness probe would otherwise stay out of rotation forever.

// newCanary is the probe's request: a real decision (so a backend that
// answers but cannot write, read-only or out of memory, fails it) on a key
// of its own that no rule's stored key can equal (those end in a 22-byte
// digest), limited so high that it is never rejected, with a one-second
// period so that the backend forgets it at once.
func newCanary() backend.Request {
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

// errProbeCached is a probe answered from a cache in process: no evidence.
var errProbeCached = errors.New("ceiling: probe answered from a cache, not by the backend")

// startProber starts the probe loop; the breaker calls it when it opens.
func (l *Limiter) startProber() {
	f := l.fo
	f.probeMu.Lock()
	defer f.probeMu.Unlock()
	if f.stopped || f.probing {
		return
	}
	f.probing = true
	f.probeWG.Add(1)
	go l.probeLoop()
}

// stopProber stops the probe loop and waits for it.
func (l *Limiter) stopProber() {
	f := l.fo
	f.probeMu.Lock()
	if !f.stopped {
		f.stopped = true
		close(f.stop)
	}
	f.probeMu.Unlock()
	f.probeWG.Wait()
}

// probeLoop probes the backend until it answers (and closes the breaker)
// or the limiter is closed. The first probe goes a cool-down after the
// opening; the interval doubles while probes fail, up to the maximum, and
// every wait is jittered.
func (l *Limiter) probeLoop() {
	f, b := l.fo, l.fo.breaker
	defer f.probeWG.Done()
	interval := l.cfg.breaker.CoolDown
	// The opening set when the first probe goes (jittered), before this
	// goroutine ran: the 503s' Retry-After already says so.
	t := time.NewTimer(b.FirstProbe())
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		err := l.probe()
		if err == nil {
			if f.usesLocal {
				h := l.cfg.breaker.MaxCoolDown + l.cfg.timeout
				f.handoverUntil.Store(l.cfg.clock().Add(h).UnixNano())
			}
			f.probeMu.Lock()
			f.probing = false
			f.probeMu.Unlock()
			b.Close()
			f.resend.poke() // writes that waited for the recovery
			return
		}
		interval = min(2*interval, l.cfg.breaker.MaxCoolDown)
		wait := failover.Jittered(interval)
		b.Probed(err, wait)
		t.Reset(wait)
	}
}

// probe asks the backend for a canary decision and, when it answers,
// charges it with what FailLocal admitted meanwhile. It reports why the
// backend cannot be trusted yet, or nil. On a backend of several servers
// ([backend.Spread]: Redis Cluster) there is one canary on each, decided in
// one call: every server must answer, or a cluster with a master down
// would look healthy whenever the canary's own master answers.
func (l *Limiter) probe() error {
	reqs, err := l.canaries()
	if err != nil {
		return err
	}
	out := make([]backend.Result, len(reqs))
	start := time.Now()
	err = l.bounded(context.Background(), op{reqs: reqs, out: out})
	if obs := l.cfg.observer; obs != nil {
		observeCall(obs, time.Since(start), out, err)
	}
	if err != nil {
		return err
	}
	for i := range out {
		switch {
		case out[i].Cached:
			return errProbeCached
		case !out[i].Allowed:
			return fmt.Errorf("ceiling: probe: the backend rejected a canary far under its limit (retry after %v)", out[i].RetryAfter)
		}
	}
	return l.chargeLocal()
}

// canaries are the probe's requests: the canary, or one variant of it on
// each server of a backend of several.
func (l *Limiter) canaries() ([]backend.Request, error) {
	c := l.fo.canary
	if l.fo.spread == nil {
		return []backend.Request{c}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.timeout)
	defer cancel()
	keys, err := l.fo.spread.SpreadKeys(ctx, c.Key)
	if err != nil {
		return nil, fmt.Errorf("ceiling: probe: %w", err)
	}
	reqs := make([]backend.Request, len(keys))
	for i, k := range keys {
		reqs[i] = c
		reqs[i].Key = k
	}
	return reqs, nil
}

// trip opens the breaker at once, without waiting for consecutive
// failures: the start-up check found the backend unable to decide.
func (l *Limiter) trip(err error) {
	if b := l.fo.breaker; b != nil {
		b.Open(err, 1)
	}
}
