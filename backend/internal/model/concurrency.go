package model

import (
	"slices"

	"github.com/ceiling-go/ceiling/backend"
)

// Lease is one acquisition of a Concurrency key: N units held by ID until
// Exp (µs).
type Lease struct{ ID, N, Exp int64 }

// concurrency transcribes ALGORITHMS.md's Concurrency section.
func concurrency(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	var live []Lease // live while now < exp, in insertion order
	if s != nil {
		for _, l := range s.Leases {
			if now < l.Exp {
				live = append(live, l)
			}
		}
	}
	count := func(ls []Lease) int64 {
		n := int64(0)
		for _, l := range ls {
			n = add(n, l.N)
		}
		return n
	}
	// retry: the smallest exp e of a live lease such that count - (units
	// of the live leases with exp <= e) + x <= L, as e - now.
	retry := func(ls []Lease, x int64) int64 {
		k, e := count(ls), int64(-1)
		for _, cand := range ls {
			freed := int64(0)
			for _, l := range ls {
				if l.Exp <= cand.Exp {
					freed = add(freed, l.N)
				}
			}
			if k-freed+x <= L && (e < 0 || cand.Exp < e) {
				e = cand.Exp
			}
		}
		if e < 0 {
			panic("model: no lease makes room")
		}
		return e - now
	}
	after := func(ls []Lease) (remaining, reset, next int64) {
		k := count(ls)
		for _, l := range ls {
			reset = max(reset, l.Exp-now)
		}
		if L-k <= 0 {
			next = retry(ls, 1)
		}
		return L - k, reset, next
	}
	i := slices.IndexFunc(live, func(l Lease) bool { return l.ID == r.Lease })
	switch {
	case c > 0 && i >= 0:
		live[i].Exp = now + P
	case c > 0 && !r.Force && add(count(live), c) > L:
		rt := int64(-1)
		if c <= L {
			rt = retry(live, c)
		}
		remaining, reset, next := after(live)
		return nil, result(r, false, remaining, reset, rt, next), false
	case c > 0:
		live = append(live, Lease{ID: r.Lease, N: c, Exp: now + P})
	case c < 0 && i >= 0:
		if live[i].N += c; live[i].N <= 0 {
			live = slices.Delete(live, i, i+1)
		}
	}
	remaining, reset, next := after(live)
	st := &State{Algorithm: backend.Concurrency, Leases: live, Written: now, Expires: now}
	for _, l := range live {
		st.Expires = max(st.Expires, l.Exp)
	}
	return st, result(r, true, remaining, reset, 0, next), true
}
