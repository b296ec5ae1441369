package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// entryKind reads an entry as "ticket", "record", "lapsed" or "none" at now.
func entryKind(v string, now time.Time) string {
	if v == "" {
		return "none"
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	switch {
	case n < 0 && -n > now.UnixMicro():
		return "ticket"
	case n > now.UnixMicro():
		return "record"
	}
	return "lapsed"
}

// TestClusterUndoOverARecordProbes_Attack probes the inverse's forced
// no-unit request (4e76a2f) on combinations where a forced charge's record
// of X stands before the call: each undo must leave the units the model
// leaves (the rejected call consumed nothing) and the record, so that the
// charge's resend is a peek, and must not write entries on other keys.
func TestClusterUndoOverARecordProbes_Attack(t *testing.T) {
	type probe struct {
		name     string
		alg      backend.Algorithm
		call     func(reserve, refund, charge backend.Request) []backend.Request
		inverted bool
	}
	var probes []probe
	for _, inv := range []bool{true, false} {
		for _, alg := range []backend.Algorithm{backend.FixedWindow, backend.SlidingWindow, backend.GCRA, backend.SlidingLog, backend.RollingWindow} {
			probes = append(probes,
				probe{"resent reservation", alg, func(r, _, _ backend.Request) []backend.Request { return []backend.Request{r} }, inv},
				probe{"twin resends", alg, func(r, _, _ backend.Request) []backend.Request { return []backend.Request{r, r} }, inv},
				probe{"reservation, refund", alg, func(r, f, _ backend.Request) []backend.Request { return []backend.Request{r, f} }, inv},
				probe{"refund, reservation", alg, func(r, f, _ backend.Request) []backend.Request { return []backend.Request{f, r} }, inv},
				probe{"charge, reservation", alg, func(r, _, c backend.Request) []backend.Request { return []backend.Request{c, r} }, inv},
				probe{"reservation, charge", alg, func(r, _, c backend.Request) []backend.Request { return []backend.Request{r, c} }, inv},
			)
		}
	}
	client := redistest.SharedCluster(t).Client(t)
	for i, p := range probes {
		name := p.name + "/" + strconv.Itoa(int(p.alg))
		if p.inverted {
			name += "/inverted"
		} else {
			name += "/put back"
		}
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock()
			s := New(client, WithPrefix(redistest.KeyPrefix(t)+strconv.Itoa(i)), WithClock(clock.Now), WithDenyCache(0))
			reserve := backend.Request{Key: "{a}r", Algorithm: p.alg, Limit: 20, Period: time.Hour, Cost: 3, Once: 81}
			first := decide(t, s, reserve)[0]
			charge := reserve
			charge.Cost, charge.Force = 2, true
			decide(t, s, charge)
			refund := reserve
			refund.Cost, refund.Stamp = -3, first.Stamp
			side := reserve
			side.Key = "{a}s" // another key of the slot, the same Once, no entry
			call := append(p.call(reserve, refund, charge), side)
			one := reserve
			one.Cost, one.Once = 1, 0
			want := int64(20 - 3 - 2)
			if !p.inverted {
				one.Key = "{c}z" // another slot's key: reqs' key is put back
			} else {
				want--
			}
			before := remainingOf(t, s, reserve)
			undoneWith(t, s, call, one, nil)
			got, entry := remainingOf(t, s, reserve), entryKind(onceEntry(t, s, reserve), clock.Now())
			sideEntry := entryKind(onceEntry(t, s, side), clock.Now())
			res := decide(t, s, charge)[0] // the charge's resend
			after := remainingOf(t, s, reserve)
			if remainingOf(t, s, side) != 20 || sideEntry != "none" {
				t.Errorf("the other key of the slot: %d remaining, entry %s; want 20, none", remainingOf(t, s, side), sideEntry)
			}
			if got != want || entry != "record" || after != want {
				t.Errorf("before %d; after the undo %d remaining, entry %s; after the charge's resend (%+v) %d; want %d, record, %d", before, got, entry, res, after, want, want)
			}
		})
	}
}

// TestClusterUndoAfterTheRecordLapsed_Attack: the record of X stood
// when the call ran but has lapsed by the undo (the fake clock advanced
// between): the inverse's forced no-unit request writes a fresh record
// that no forced charge of the model left. Probe: only a forced charge
// with X could find the difference, and the caller sends one only while
// the first's record surely holds, so it reports what is left.
func TestClusterUndoAfterTheRecordLapsed_Attack(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	clock := newFakeClock()
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithClock(clock.Now), WithDenyCache(0))
	reserve := backend.Request{Key: "{a}r", Algorithm: backend.FixedWindow, Limit: 10, Period: 10 * time.Second, Cost: 3, Once: 82}
	decide(t, s, reserve)
	charge := reserve
	charge.Cost, charge.Force = 2, true
	decide(t, s, charge) // its record holds 20 s
	clock.Advance(19 * time.Second)
	one := reserve
	one.Cost, one.Once = 1, 0
	undoneWith(t, s, []backend.Request{reserve}, one, func() { clock.Advance(2 * time.Second) })
	t.Logf("entry after the undo: %s (the model: lapsed or none)", entryKind(onceEntry(t, s, reserve), clock.Now()))
}
