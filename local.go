package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	"github.com/ceiling-go/ceiling/internal/failover"
)

// FailLocal's store, and how its bound holds across the edges of an outage.
//
// Inside an outage each instance admits its share of each limit, so n
// instances admit at most n × share × limit per window. At the edges the
// local stores and the backend each know only their own half: a window
// that spans the start could hold the backend's full limit and then every
// instance's share again, and one that spans the end the shares and then
// the backend's full limit again. Two things close the gap:
//
//   - the start: every answer of the backend says how much of the key's
//     limit is in use and until when (failover.Seen). When an outage begins,
//     the local store decides a key with the same fraction of its share
//     already spent, so instances that saw a key at its limit admit nothing
//     more locally until the backend said it would have room again, and n
//     instances that saw it half spent admit half a limit between them;
//   - the end: every key the local store admitted is journaled, and the
//     probe that finds the backend answering charges it, forced and in one
//     round trip per few hundred keys, with what the local store still
//     counts in the key's open window, before the breaker closes; the
//     concurrency slots it holds move to the backend then too, each by
//     its lease (retakeSlots), so the other instances count them at
//     once, and stay counted locally until the hand-over ends;
//   - the instances do not find the backend back at the same moment (each
//     probes on its own schedule, up to MaxCoolDown apart), and until the
//     last has charged it the backend knows only part of what was admitted.
//     So for a hand-over of MaxCoolDown plus the timeout after its
//     recovery, an instance decides FailLocal rules both locally, at its
//     share, and on the backend: each instance stays within its share
//     across the edge, and by the time any of them decides on the backend
//     alone, every instance has charged it.
//
// Both err on the side of the limit: the seeds and the charges are counted
// from the moment they are applied, so a key can be held a little longer
// than strictly needed, never admitted more.

// localMaxKeys bounds FailLocal's store, and its journal: they hold only an
// outage's keys.
const localMaxKeys = failover.MaxJournal

type localStore struct {
	b    backend.Backend
	into backend.DecideInto
}

// decide decides reqs into out on the local store.
func (ls *localStore) decide(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	if ls.into != nil {
		return ls.into.DecideInto(ctx, reqs, out)
	}
	res, err := ls.b.Decide(ctx, reqs)
	if err == nil && len(res) != len(out) {
		err = failover.ErrResultCount
	}
	copy(out, res)
	return err
}

// localStore returns FailLocal's store, creating it on first use.
func (l *Limiter) localStore() *localStore {
	f := l.fo
	if ls := f.local.Load(); ls != nil {
		return ls
	}
	f.localMu.Lock()
	defer f.localMu.Unlock()
	if ls := f.local.Load(); ls != nil {
		return ls
	}
	b := l.cfg.localStore
	if b == nil {
		// No janitor: nothing to stop, and the key bound (which sweeps
		// under pressure) keeps an outage's keys in check.
		m := memory.New(memory.WithSweepInterval(0), memory.WithMaxKeys(localMaxKeys), memory.WithLogger(l.cfg.logger))
		f.closers = append(f.closers, m)
		b = m
	}
	ls := &localStore{b: b}
	ls.into, _ = b.(backend.DecideInto)
	f.local.Store(ls)
	return ls
}

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
	f := l.fo
	now := l.cfg.clock()
	sc.wait = sc.wait[:0]
	blocked := false
	for j := range sc.reqs {
		q := &sc.reqs[j]
		sc.wait = append(sc.wait, 0)
		s, ok := f.seen.Lookup(q.Key, now.UnixNano())
		if !ok || q.Cost <= 0 {
			continue
		}
		capacity := capacityOf(*q)
		room := capacity - min(seedOf(s.Used, l.cfg.localShare), capacity)
		if room < q.Cost {
			sc.wait[j] = time.Duration(s.Until - now.UnixNano())
			blocked = blocked || !q.Shadow
			continue
		}
		if q.Algorithm == backend.GCRA {
			q.Burst = room
		} else {
			q.Limit = room
		}
	}
	for j := range sc.reqs {
		if blocked || sc.wait[j] > 0 {
			sc.reqs[j].Cost = 0 // refused by a seed: consume nothing, report the state
		}
	}
	lo := sc.out[:len(sc.reqs)]
	if err := l.localStore().decide(ctx, sc.reqs, lo); err != nil {
		return err
	}
	for j, i := range sc.idx {
		if w := sc.wait[j]; w > 0 {
			lo[j].Allowed, lo[j].Remaining = false, 0
			lo[j].RetryAfter, lo[j].ResetAfter = max(lo[j].RetryAfter, w), max(lo[j].ResetAfter, w)
		}
		out[i] = lo[j]
		// A concurrency slot is not charged from the journal: the recovery
		// moves it to the backend by its lease (retakeSlots).
		if !blocked && lo[j].Allowed && sc.reqs[j].Cost > 0 && sc.reqs[j].Algorithm != Concurrency {
			f.journal.Add(st.reqs[i], localRequest(st.reqs[i], l.cfg.localShare))
		}
	}
	return nil
}

// seedOf is this instance's share of the units the backend last said were
// in use: with n instances each holding 1/n of the limit locally, each
// starts its share 1/n spent by what all of them had spent, so together
// they continue exactly where the backend stopped. Rounded up, towards the
// limit.
func seedOf(used int64, share float64) int64 {
	return int64(math.Ceil(float64(used) * share))
}

// chargeLocal charges the backend with what the local store still counts
// for every key it admitted while degraded, forced, then forgets those keys
// locally, and takes every concurrency slot this instance holds again on
// the backend (retakeSlots). The prober calls it once the backend answers,
// before closing the breaker; on error the journal keeps what was not
// charged, and the slots not moved stay local.
func (l *Limiter) chargeLocal() error {
	if err := l.chargeJournal(); err != nil {
		return err
	}
	return l.retakeSlots(context.Background())
}

// chargeJournal charges the backend with the rate rules' units the local
// store admitted (chargeLocal).
func (l *Limiter) chargeJournal() error {
	f := l.fo
	entries := f.journal.Take()
	if len(entries) == 0 {
		return nil
	}
	ctx := context.Background()
	ls := l.localStore()
	peeks := make([]backend.Request, len(entries))
	for i := range entries {
		peeks[i] = entries[i].Local
	}
	res := make([]backend.Result, len(peeks))
	if err := ls.decide(ctx, peeks, res); err != nil {
		f.journal.Restore(entries)
		return fmt.Errorf("ceiling: recovery charge: reading the local store: %w", err)
	}
	var charges []backend.Request
	var from []int // entry of each charge
	var units int64
	for i, e := range entries {
		used := capacityOf(e.Local) - res[i].Remaining
		if used <= 0 {
			continue
		}
		q := e.Global
		q.Cost, q.Force, q.Shadow = used, true, false
		charges = append(charges, q)
		from = append(from, i)
		units += used
	}
	for lo := 0; lo < len(charges); lo += chargeBatch {
		hi := min(lo+chargeBatch, len(charges))
		out := make([]backend.Result, hi-lo)
		if err := l.bounded(ctx, op{reqs: charges[lo:hi], out: out}); err != nil {
			f.journal.Restore(entries[from[lo]:])
			return fmt.Errorf("ceiling: recovery charge of %d keys: %w", len(charges)-lo, err)
		}
	}
	if len(charges) > 0 {
		l.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "ceiling: charged the backend with what FailLocal admitted while it was down",
			slog.Int("keys", len(charges)), slog.Int64("units", units))
	}
	return nil
}

// handover decides st's FailLocal rules on the local store first, at the
// instance's share, then the whole request on the backend, while the
// hand-over after a recovery lasts (see the top of this file). It reports
// whether it decided (the results are in st.results); an error is the
// backend's, for the fail modes, and nothing stays consumed locally. When no
// rule fails local it does nothing.
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
	ls := l.localStore()
	lo := sc.out[:len(sc.reqs)]
	if err := ls.decide(ctx, sc.reqs, lo); err != nil {
		return false, nil // the backend alone, then
	}
	out := st.results[:len(st.reqs)]
	blocked := false
	for j := range lo {
		blocked = blocked || (!lo[j].Allowed && !sc.reqs[j].Shadow)
	}
	if blocked {
		for i := range out {
			out[i] = backend.Result{Allowed: true, Limit: st.reqs[i].Limit, Unread: true}
		}
		for j, i := range sc.idx {
			out[i] = lo[j]
			d.Results[i].Fallback = FailLocal
		}
		return true, nil
	}
	err := l.call(ctx, st.reqs, out)
	admitted := err == nil
	for i := range out {
		admitted = admitted && (out[i].Allowed || st.reqs[i].Shadow)
	}
	if !admitted {
		// Give back what the local store took: the request was not admitted
		// (or the fail modes will decide it afresh).
		for j := range sc.reqs {
			if !lo[j].Allowed {
				sc.reqs[j].Cost = 0
			}
			sc.reqs[j].Cost = -sc.reqs[j].Cost
		}
		_ = ls.decide(ctx, sc.reqs, lo)
	}
	return true, err
}

// handingOver reports whether the hand-over after a recovery lasts.
func (f *failState) handingOver(now time.Time) bool {
	until := f.handoverUntil.Load()
	return until != 0 && now.UnixNano() < until
}

// chargeBatch is how many keys one recovery charge call carries.
const chargeBatch = 256
