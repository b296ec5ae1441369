package failover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// While the breaker is open, one goroutine per limiter probes the backend
// (probeLoop), so that recovery needs no traffic: an idle instance whose
// health check is a readiness probe would otherwise stay out of rotation
// forever.

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

// startProber starts the probe loop unless one runs; the breaker calls it
// when it opens.
func (e *Engine) startProber() {
	if !e.probing.CompareAndSwap(false, true) {
		return
	}
	if !e.group.Go(e.probeLoop) {
		e.probing.Store(false)
	}
}

// probeLoop probes the backend until it answers (then it hands over,
// closes the breaker and wakes the resends waiting for the recovery) or
// the group stops. The first probe goes when the opening said it would;
// the interval doubles while probes fail, up to MaxCoolDown, and every
// wait is jittered.
func (e *Engine) probeLoop() {
	b := e.Breaker
	interval := b.cfg.CoolDown
	t := time.NewTimer(b.FirstProbe())
	defer t.Stop()
	for {
		select {
		case <-e.group.Stopping():
			e.probing.Store(false)
			return
		case <-t.C:
		}
		err := e.probe()
		if err == nil {
			e.handOver()
			e.probing.Store(false)
			b.Close()
			e.Resends.Poke()
			return
		}
		interval = min(2*interval, b.cfg.MaxCoolDown)
		wait := Jittered(interval)
		b.Probed(err, wait)
		t.Reset(wait)
	}
}

// ConfirmBudget is the least time the probe that confirms a run of
// timeouts gives the backend: a healthy Redis answers a canary in well
// under a millisecond, so one that sends nothing for a second is at fault,
// while a process too busy to read replies within the request timeout
// usually reads this one.
const ConfirmBudget = time.Second

// errProbeCached is a probe answered from a cache in process: no evidence.
var errProbeCached = errors.New("ceiling: probe answered from a cache, not by the backend")

// Start wires the engine's breaker (tuned by c), its prober and its
// resends to each other and to the engine's backend, for a backend that
// does I/O; the group runs their goroutines. Set Caller, Local and the
// engine's other fields, and Resends' Keep and Dropped, first.
func (e *Engine) Start(c Config, group *Group) {
	e.group, e.canary = group, NewCanary()
	e.Breaker = New(c, e.Now, e.Transition, e.startProber, e.IsTimeout, e.startConfirm)
	e.Caller.Breaker, e.Caller.Answered = e.Breaker, e.answered
	r := &e.Resends
	r.Group, r.Ready, r.Timeout = group, e.Breaker.Closed, e.Caller.Timeout
	r.Send = func(reqs []backend.Request) error {
		return e.Caller.Outside(context.Background(), Op{Reqs: reqs, Out: make([]backend.Result, len(reqs))})
	}
}

// CanaryKey is the probe's key.
func (e *Engine) CanaryKey() string { return e.canary.Key }

// answered takes an answer of the backend's own: it wakes the resends,
// and, for FailLocal, learns what the backend said of each key and
// charges it with what the local store admitted while the timeouts were
// unconfirmed.
func (e *Engine) answered(reqs []backend.Request, out []backend.Result) {
	if e.Resends.Pending() > 0 {
		e.Resends.Poke()
	}
	if e.UsesLocal && len(reqs) > 0 {
		e.Local.Seen.Learn(reqs, out, e.Now())
		if e.Local.Journal.Len() > 0 && e.Breaker.Closed() {
			e.chargeSoon()
		}
	}
}

// probe asks the backend for a canary decision and, when it answers,
// charges it with what FailLocal admitted meanwhile, then lets Retake take
// the concurrency slots this instance holds again on the backend. It
// reports why the backend cannot be trusted yet, or nil; on error the
// journal keeps what was not charged.
func (e *Engine) probe() error {
	if err := e.Canary(e.Caller.Timeout); err != nil {
		return err
	}
	if err := e.chargeJournal(); err != nil {
		return err
	}
	return e.Retake(context.Background())
}

// handOver starts the hand-over after a recovery, if some rule fails
// local.
func (e *Engine) handOver() {
	if e.UsesLocal {
		e.Local.StartHandOver(e.Now())
	}
}

// Canary decides the probe's canaries within timeout and reports why the
// backend cannot be trusted yet, or nil. On a backend of several servers
// ([backend.Spread]: Redis Cluster) there is one canary on each, decided
// in one call: every server must answer, or a cluster with a master down
// would look healthy whenever the canary's own master answers.
func (e *Engine) Canary(timeout time.Duration) error {
	reqs := []backend.Request{e.canary}
	if e.Spread != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		keys, err := e.Spread.SpreadKeys(ctx, e.canary.Key)
		cancel()
		if err != nil {
			return fmt.Errorf("ceiling: probe: %w", err)
		}
		reqs = make([]backend.Request, len(keys))
		for i, k := range keys {
			reqs[i] = e.canary
			reqs[i].Key = k
		}
	}
	out := make([]backend.Result, len(reqs))
	start := time.Now()
	err := e.Caller.Bounded(context.Background(), Op{Reqs: reqs, Out: out, Timeout: timeout})
	if e.Caller.Observe != nil {
		e.Caller.Observe(time.Since(start), out, err)
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
	return nil
}

// startConfirm starts the probe that confirms a run of timeouts (the
// breaker calls it, see Breaker.Failure), off every request's path:
// requests meanwhile keep calling the backend, and a timeout sheds their
// FailOpen rules (unconfirmed).
func (e *Engine) startConfirm() {
	b := e.Breaker
	if !e.group.Go(func() {
		if err := e.confirm(); Overloaded(err) {
			b.NoVerdict()
		} else {
			b.Confirmed(err)
		}
	}) {
		b.Confirmed(nil) // closed: nothing more to confirm
	}
}

// confirm decides the canaries with their own budget and reports whether
// the backend is at fault: nil when it answered in time, an overloaded
// error when this process was too busy to ask it (no verdict), or the
// failure. A canary answered within its budget but later than the
// timeout says the backend may be too slow for the timeout, or this
// process too slow to read it: the canaries then go again at the timeout,
// and the backend's own judgement of that call decides (a backend that
// stays silent past the timeout is at fault; a reply that waits to be read
// is this process's delay, no verdict).
func (e *Engine) confirm() error {
	timeout := e.Caller.Timeout
	start := time.Now()
	err := e.Canary(max(timeout, ConfirmBudget))
	if err == nil && time.Since(start) > timeout {
		err = e.Canary(timeout)
	}
	if err == nil {
		// The edge of what may have been an outage that other instances
		// saw confirmed: hand over as after a recovery, and charge what
		// FailLocal admitted meanwhile.
		e.handOver()
		if e.Local.Journal.Len() > 0 {
			e.chargeSoon()
		}
	}
	return err
}

// chargeSoon charges the backend, in the background, with what FailLocal
// admitted while the breaker was closed (timeouts no probe had confirmed
// yet), once the backend answers again: the recovery's charge, without a
// recovery. One charge runs at a time.
func (e *Engine) chargeSoon() {
	if !e.charging.CompareAndSwap(false, true) {
		return
	}
	if !e.group.Go(func() {
		defer e.charging.Store(false)
		_ = e.chargeJournal() // on error the journal keeps it for the next answer
	}) {
		e.charging.Store(false)
	}
}

// chargeJournal charges the backend with the rate rules' units the local
// store admitted (Local.Charge).
func (e *Engine) chargeJournal() error {
	ctx := context.Background()
	keys, units, err := e.Local.Charge(ctx, func(reqs []backend.Request) error {
		return e.Caller.Bounded(ctx, Op{Reqs: reqs, Out: make([]backend.Result, len(reqs))})
	})
	if keys > 0 {
		e.Logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: charged the backend with what FailLocal admitted while it was down",
			slog.Int("keys", keys), slog.Int64("units", units))
	}
	return err
}
