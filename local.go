package ceiling

import (
	"context"
	"log/slog"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// FailLocal's store, and how its bound holds across the edges of an
// outage, live in failover.Local (see there); this file hands it the
// rules that fail local.

// localStore is FailLocal's store.
type localStore = failover.LocalStore

// localRequest is req scaled to its share of the limit.
var localRequest = failover.Scaled

// localStore returns FailLocal's store, creating it on first use.
func (l *Limiter) localStore() *localStore { return l.fo.local.Get() }

type localScratch struct {
	reqs []backend.Request
	out  []backend.Result
	idx  []int           // the decision's index of each local request
	wait []time.Duration // > 0: refused by its seed for that long
}

// decideLocal decides sc.reqs (already scaled to the local share) on the
// local store, all or nothing, into out at sc.idx, starting each key from
// what the backend last said of it, and journals what it admits.
func (l *Limiter) decideLocal(ctx context.Context, st *state, sc *localScratch, out []backend.Result) error {
	lo := sc.out[:len(sc.reqs)]
	sc.wait = append(sc.wait[:0], make([]time.Duration, len(sc.reqs))...)
	if err := l.fo.local.Decide(ctx, l.cfg.clock(), sc.reqs, sc.wait, lo, st.reqs, sc.idx); err != nil {
		return err
	}
	for j, i := range sc.idx {
		out[i] = lo[j]
	}
	return nil
}

// chargeLocal charges the backend with what the local store still counts
// for every key it admitted while degraded, forced, then takes every
// concurrency slot this instance holds again on the backend (retakeSlots).
// The prober calls it once the backend answers, before closing the
// breaker; on error the journal keeps what was not charged, and the slots
// not moved stay local.
func (l *Limiter) chargeLocal() error {
	if err := l.chargeJournal(); err != nil {
		return err
	}
	return l.retakeSlots(context.Background())
}

// chargeJournal charges the backend with the rate rules' units the local
// store admitted (chargeLocal).
func (l *Limiter) chargeJournal() error {
	ctx := context.Background()
	keys, units, err := l.fo.local.Charge(ctx, func(reqs []backend.Request) error {
		return l.bounded(ctx, op{reqs: reqs, out: make([]backend.Result, len(reqs))})
	})
	if keys > 0 {
		l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: charged the backend with what FailLocal admitted while it was down",
			slog.Int("keys", keys), slog.Int64("units", units))
	}
	return err
}

// handover decides st's FailLocal rules on the local store first, at the
// instance's share, then the whole request on the backend, while the
// hand-over after a recovery lasts (failover.Local.HandOverDecide). It
// reports whether it decided (the results are in st.results); an error is
// the backend's, for the fail modes. When no rule fails local it does
// nothing.
func (l *Limiter) handover(ctx context.Context, st *state) (bool, error) {
	d := &st.decision
	f := l.fo
	sc := f.scratch.Get().(*localScratch)
	defer f.scratch.Put(sc)
	sc.reqs, sc.idx = sc.reqs[:0], sc.idx[:0]
	for i := range d.Results {
		if l.modeOf(d.Results[i].Rule) == FailLocal {
			sc.reqs = append(sc.reqs, localRequest(st.reqs[i], l.cfg.localShare))
			sc.idx = append(sc.idx, i)
		}
	}
	if len(sc.reqs) == 0 {
		return false, nil
	}
	lo := sc.out[:len(sc.reqs)]
	out := st.results[:len(st.reqs)]
	ok, refused, err := f.local.HandOverDecide(ctx, sc.reqs, lo, func() (bool, error) {
		err := l.call(ctx, st.reqs, out)
		admitted := err == nil
		for i := range out {
			admitted = admitted && (out[i].Allowed || st.reqs[i].Shadow)
		}
		return admitted, err
	})
	if !ok {
		return false, nil // the backend alone, then
	}
	if refused {
		for i := range out {
			out[i] = backend.Result{Allowed: true, Limit: st.reqs[i].Limit, Unread: true}
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
			d.Results[i].Fallback = FailLocal
		}
		return true, nil
	}
	return true, err
}

// chargeBatch is how many keys one recovery charge call carries.
const chargeBatch = failover.ChargeBatch
