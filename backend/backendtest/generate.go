package backendtest

import (
	"math/rand/v2"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// modelAlgorithms are the rate algorithms: every one, so that a new
// algorithm is tested as soon as it exists (the model panics until it
// implements it). [Differential.Concurrent] draws from them.
var modelAlgorithms = backend.Algorithms()

// sequenceAlgorithms are the algorithms random sequences use: the rate
// algorithms and Concurrency, whose requests carry lease ids
// (leaseRequest).
var sequenceAlgorithms = append(backend.Algorithms(), backend.Concurrency)

// periods are the periods rules are drawn from: the shortest Validate
// allows, odd numbers of µs and ms that windows do not divide evenly, the
// usual ones, and the longest.
var periods = []time.Duration{
	time.Millisecond, 1001 * time.Microsecond, 1500 * time.Microsecond, 7 * time.Millisecond,
	time.Second, 1500 * time.Millisecond, 3 * time.Second, time.Minute, time.Hour, 25 * time.Hour,
	backend.MaxPeriod - time.Microsecond, backend.MaxPeriod,
}

// leasePeriods are the periods Concurrency rules are usually drawn from:
// the limiter's leases are at least a second.
var leasePeriods = []time.Duration{time.Second, 1500 * time.Millisecond, 3 * time.Second, time.Minute, time.Hour}

// generate returns a random sequence on keys: each key gets a rule (its
// algorithm is the key's for the whole sequence, as a rule's is), and calls
// of one to four requests on random keys, sometimes under another limit or
// period, at instants chosen to land on the boundaries where algorithms
// change their answer. It ends with a peek of every key.
//
// A Concurrency key's requests acquire, renew and release leases (see
// leasePool.request), and the instants include its leases' expiries; one
// sequence in eight has only Concurrency keys. Refunds are often stamped
// with an earlier admission's stamp (see stampPool), and the clock
// sometimes steps back (see nextInstant). Some settlements carry a Once,
// and some calls send one of them again, unchanged, within its Period (see
// settlements).
func generate(rng *rand.Rand, keys []string) []Step {
	algs := sequenceAlgorithms
	if rng.IntN(8) == 0 {
		algs = []backend.Algorithm{backend.Concurrency} // leases only: their instants, contention
	}
	rules := make(map[string]backend.Request, len(keys))
	for _, k := range keys {
		rules[k] = randomRule(rng, k, algs)
	}
	ls := &leasePool{ids: map[string][]int64{}}
	sp := stampPool{}
	var sent settlements
	m := model.New()
	var steps []Step
	var at time.Duration
	for range 4 + rng.IntN(28) {
		at = nextInstant(rng, m, keys, rules, at)
		now := Epoch.Add(at).UnixMicro()
		if rng.IntN(10) == 0 {
			// An operator changes a rule's limit: every later request
			// of the rule's key brings the new one.
			k := keys[rng.IntN(len(keys))]
			rules[k] = changeLimit(rng, rules[k])
		}
		if rng.IntN(30) == 0 {
			st := Step{At: at, Reset: []string{keys[rng.IntN(len(keys))]}}
			if rng.IntN(2) == 0 {
				st.Reset = append(st.Reset, keys[rng.IntN(len(keys))])
			}
			m.Reset(st.Reset...)
			steps = append(steps, st)
			continue
		}
		call := make([]backend.Request, 1+rng.IntN(4)*rng.IntN(2))
		for i := range call {
			call[i] = randomRequest(rng, rules[keys[rng.IntN(len(keys))]])
			if call[i].Algorithm == backend.Concurrency {
				call[i] = ls.request(rng, call[i], m, now)
			} else if call[i].Cost < 0 || rng.IntN(12) == 0 {
				call[i] = sp.refund(rng, call[i])
			}
			call[i] = sent.next(rng, call[i], at)
		}
		steps = append(steps, Step{At: at, Decide: call})
		res, ok := decideModel(m, now, call)
		if !ok {
			return steps // check reports the model's panic
		}
		sp.learn(call, res)
	}
	at = nextInstant(rng, m, keys, rules, at)
	for _, k := range keys {
		steps = append(steps, Step{At: at, Decide: []backend.Request{rules[k]}})
	}
	return steps
}

// settlements is the settlements with a Once a sequence sent, each with
// the instant it was first sent: what a caller resending lost replies
// holds. hi is the latest instant a call was sent at.
type settlements struct {
	hi   time.Duration
	sent []struct {
		at time.Duration
		r  backend.Request
	}
}

// next returns r, drawn for a call at at: a reservation (an admission
// of a rate algorithm) or a settlement named by a fresh Once one time in
// three, a refund one time in two named by the Once of a recent
// reservation (its ticket), or, one time in six, an earlier reservation
// or settlement sent again unchanged, within a Period of its first
// sending as a caller repeats one (ALGORITHMS.md: Once). One is not sent
// again at an instant before its ticket or record lapses once the clock
// has been at or past that lapse: a backend may drop a lapsed one whenever
// it sees it lapsed (Postgres at the key's next settlement, the memory
// store at a sweep), so whether a clock stepped back finds it again is the
// backend's.
func (p *settlements) next(rng *rand.Rand, r backend.Request, at time.Duration) backend.Request {
	p.hi = max(p.hi, at)
	if len(p.sent) > 0 && rng.IntN(6) == 0 {
		s := p.sent[len(p.sent)-1-rng.IntN(min(len(p.sent), 4))]
		if at-s.at < s.r.Period && p.unlapsed(s.r, s.at, at) {
			return s.r
		}
	}
	if r.Algorithm == backend.Concurrency || r.Cost == 0 {
		return r
	}
	if r.Cost < 0 && len(p.sent) > 0 && rng.IntN(2) == 0 {
		s := p.sent[len(p.sent)-1-rng.IntN(min(len(p.sent), 4))]
		if s.r.Key == r.Key && s.r.Cost > 0 && !s.r.Force && p.unlapsed(s.r, s.at, at) {
			r.Once = s.r.Once
			return r
		}
	}
	if rng.IntN(3) == 0 {
		r.Once = 1 + rng.Int64N(1<<40)
		p.sent = append(p.sent, struct {
			at time.Duration
			r  backend.Request
		}{at, r})
	}
	return r
}

// unlapsed reports whether a call at at may name first's Once again (a
// repeat, or a refund of first's reservation): not before the lapse of
// first's ticket (a reservation's) or record once the clock was past it.
func (p *settlements) unlapsed(first backend.Request, sent, at time.Duration) bool {
	lapse := sent + keptFor(first)
	return at >= lapse || p.hi < lapse
}

// keptFor is how long a backend keeps what first, a request with a Once,
// leaves: a reservation's ticket, or a settlement's record.
func keptFor(first backend.Request) time.Duration {
	if first.Cost > 0 && !first.Force {
		return backend.TicketKept(first.Period)
	}
	return backend.OnceKept(first.Period)
}

// decideModel decides call on m, reporting false if the model panicked. An
// invalid call changes nothing, as on a backend, and has no results.
func decideModel(m *model.Model, now int64, call []backend.Request) (res []backend.Result, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	res, _ = m.Decide(now, call)
	return res, true
}

// stampPool is the stamps the admissions of a sequence returned, by key,
// each with the request that got it: what a caller that settles its
// reservations holds. A stamped refund is only ever made of one of them,
// on its key and under its rule, as ceiling's settlement sends it.
type stampPool map[string][]backend.Request

// learn keeps the stamp of every admitted request of call.
func (p stampPool) learn(call []backend.Request, res []backend.Result) {
	for i, r := range call {
		if i < len(res) && res[i].Stamp != 0 {
			r.Stamp = res[i].Stamp
			p[r.Key] = append(p[r.Key], r)
		}
	}
}

// refund makes r, drawn by randomRequest, a stamped refund of an earlier
// admission on its key more often than not, when there is one: under the
// admission's rule, giving back all its units, part of them, or more.
// Otherwise r is left as it is.
func (p stampPool) refund(rng *rand.Rand, r backend.Request) backend.Request {
	held := p[r.Key]
	if len(held) == 0 || rng.IntN(3) == 0 {
		return r
	}
	a := held[len(held)-1-rng.IntN(min(len(held), 4))] // recent ones mostly
	if rng.IntN(4) == 0 {
		a = held[rng.IntN(len(held))]
	}
	s := r
	s.Algorithm, s.Limit, s.Period, s.Burst, s.Stamp = a.Algorithm, a.Limit, a.Period, a.Burst, a.Stamp
	switch n := rng.IntN(4); {
	case n < 2:
		s.Cost = -a.Cost
	case n < 3:
		s.Cost = -(1 + rng.Int64N(a.Cost))
	default:
		s.Cost = -min(a.Cost+1+rng.Int64N(3), backend.MaxLimit)
	}
	s.Force = false
	if s.Validate() != nil {
		return r
	}
	return s
}

// randomRule draws a valid rule for key under one of algs, with cost 0:
// limits and periods from the smallest to the largest Validate allows.
func randomRule(rng *rand.Rand, key string, algs []backend.Algorithm) backend.Request {
	for {
		r := backend.Request{
			Key:       key,
			Algorithm: algs[rng.IntN(len(algs))],
			Period:    periods[rng.IntN(len(periods))],
		}
		switch n := rng.IntN(10); {
		case n < 5:
			r.Limit = 1 + rng.Int64N(5)
		case n < 7:
			r.Limit = 6 + rng.Int64N(45)
		case n < 9:
			r.Limit = 100 + rng.Int64N(1_000_000)
		default:
			r.Limit = []int64{backend.MaxLimit, backend.MaxLimit - 1, 999_999_937}[rng.IntN(3)]
		}
		if r.Algorithm == backend.Concurrency && rng.IntN(5) > 0 {
			// Leases as the limiter takes them (at least a second, a few
			// slots), so that they are often live when the sequence renews
			// or releases them, and often full.
			r.Period = leasePeriods[rng.IntN(len(leasePeriods))]
			r.Limit = 1 + rng.Int64N(4)
		}
		if r.Algorithm == backend.GCRA {
			switch n := rng.IntN(10); {
			case n < 5:
			case n < 7:
				r.Burst = 1 + rng.Int64N(r.Limit)
			case n < 9:
				r.Burst = r.Limit + 1 + rng.Int64N(r.Limit)
			default:
				// The largest burst whose tolerance Validate accepts.
				T := (int64(r.Period/time.Microsecond) + r.Limit - 1) / r.Limit
				r.Burst = min(backend.MaxLimit, 10*int64(backend.MaxPeriod/time.Microsecond)/T)
			}
		}
		if r.Validate() == nil {
			return r
		}
	}
}

// changeLimit returns rule under a new limit (and, for GCRA, burst),
// lowered or raised, as [ceiling.Limiter.SetLimit] changes it: halved,
// doubled, one up or down, or anything randomRule would draw.
func changeLimit(rng *rand.Rand, rule backend.Request) backend.Request {
	for {
		r := rule
		switch rng.IntN(5) {
		case 0:
			r.Limit = max(1, r.Limit/2)
		case 1:
			r.Limit = min(backend.MaxLimit, 2*r.Limit)
		case 2:
			r.Limit = max(1, r.Limit-1)
		case 3:
			r.Limit = min(backend.MaxLimit, r.Limit+1)
		default:
			r.Limit, r.Burst = randomRule(rng, r.Key, []backend.Algorithm{r.Algorithm}).Limit, 0
		}
		if r.Algorithm == backend.GCRA && r.Burst != 0 && rng.IntN(2) == 0 {
			r.Burst = 1 + rng.Int64N(2*r.Limit)
		}
		if r.Validate() == nil {
			return r
		}
	}
}

// randomRequest draws a request on rule's key: usually the rule itself,
// sometimes under another period or limit (two rules sharing a key), with a
// cost from a refund of more than the limit to a charge of more than it.
func randomRequest(rng *rand.Rand, rule backend.Request) backend.Request {
	r := rule
	switch rng.IntN(20) {
	case 0, 1:
		r.Period = periods[rng.IntN(len(periods))]
	case 2:
		r.Limit = max(1, r.Limit/2+rng.Int64N(3)-1)
	case 3:
		r.Limit = min(backend.MaxLimit, 2*r.Limit+rng.Int64N(3)) // callers disagree upwards too
	}
	L := r.Limit
	switch n := rng.IntN(100); {
	case n < 12:
		r.Cost = 0
	case n < 50:
		r.Cost = 1
	case n < 70:
		r.Cost = 2 + rng.Int64N(min(L, backend.MaxLimit-1))
	case n < 80:
		r.Cost = -(1 + rng.Int64N(min(L+1, backend.MaxLimit)))
	case n < 85:
		r.Cost = []int64{backend.MaxLimit, -backend.MaxLimit, rng.Int64N(backend.MaxLimit), -rng.Int64N(backend.MaxLimit)}[rng.IntN(4)]
	case n < 93:
		r.Cost = L
	default:
		r.Cost = L + 1
	}
	r.Force = rng.IntN(8) == 0
	r.Shadow = rng.IntN(8) == 0
	if r.Validate() != nil {
		r = rule
		r.Cost = 1
	}
	return r
}

// leasePool is the lease ids a sequence has used on each key, so that its
// Concurrency requests renew and release leases that exist (or existed:
// expired, released), as well as acquire new ones.
type leasePool struct {
	ids  map[string][]int64
	last int64
}

// request makes r, a request on a Concurrency key drawn by randomRequest,
// one of a lease's: an acquisition under a new id (sometimes one near
// backend.MaxLease, exact only as an integer), a renewal (the id acquired
// again, often forced as the limiter renews), a release of all, part or
// more than all of a lease's units, a release of an id never acquired, or
// a peek.
//
// A renewal or release names a lease live in m at now more often than not.
func (p *leasePool) request(rng *rand.Rand, r backend.Request, m *model.Model, now int64) backend.Request {
	ids := p.ids[r.Key]
	if s, ok := m.Stored(r.Key); ok && s.Algorithm == backend.Concurrency && rng.IntN(4) > 0 {
		var live []int64
		for _, l := range s.Leases {
			if now < l.Exp {
				live = append(live, l.ID)
			}
		}
		if len(live) > 0 {
			ids = live
		}
	}
	fresh := func() int64 { // a new id; a big one may repeat, which renews
		if rng.IntN(8) == 0 {
			return backend.MaxLease - rng.Int64N(3)*int64(1+rng.IntN(1<<20))
		}
		p.last++
		return p.last
	}
	held := func() int64 { return ids[rng.IntN(len(ids))] }
	L := r.Limit
	switch n := rng.IntN(100); {
	case n < 10:
		r.Cost, r.Lease = 0, 0
		return r
	case n < 45 || len(ids) == 0:
		r.Lease = fresh()
		p.ids[r.Key] = append(p.ids[r.Key], r.Lease)
		if r.Cost <= 0 {
			r.Cost = 1 + rng.Int64N(min(L+1, backend.MaxLimit))
		}
	case n < 65:
		r.Lease = held()
		r.Cost = max(r.Cost, 1)
		r.Force = r.Force || rng.IntN(2) == 0
	case n < 92:
		r.Lease = held()
		r.Cost = -[]int64{1, L, L + 1, 1 + rng.Int64N(min(L+1, backend.MaxLimit)), backend.MaxLimit}[rng.IntN(5)]
		r.Force = false
	default:
		r.Lease = fresh()
		r.Cost = -1 - rng.Int64N(min(L+1, backend.MaxLimit))
	}
	if r.Validate() != nil {
		r.Cost = 0
	}
	return r
}

// nextInstant returns the instant (since Epoch) of the next step: often the
// same one, often exactly on (or a µs beside) an instant where a key's
// answer changes, otherwise a random step; sometimes with nanoseconds that
// the backends must truncate, never round.
func nextInstant(rng *rand.Rand, m *model.Model, keys []string, rules map[string]backend.Request, at time.Duration) time.Duration {
	epoch := Epoch.UnixMicro()
	now := Epoch.Add(at).UnixMicro()
	next, back := now, false
	switch n := rng.IntN(100); {
	case n < 28:
	case n < 63:
		k := keys[rng.IntN(len(keys))]
		if cands := instants(m, rules[k], now); len(cands) > 0 {
			next = cands[rng.IntN(len(cands))] + []int64{-1, 0, 0, 1}[rng.IntN(4)]
		}
	case n < 88:
		P := int64(rules[keys[rng.IntN(len(keys))]].Period / time.Microsecond)
		next = now + rng.Int64N(min(P, int64(time.Hour/time.Microsecond))*3/2+1)
	case n < 93:
		next = now + rng.Int64N(int64(100*24*time.Hour/time.Microsecond))
	case n < 97:
		next = now + rng.Int64N(2000)
	case n < 99:
		// The clock steps back a little: within a period.
		P := int64(rules[keys[rng.IntN(len(keys))]].Period / time.Microsecond)
		next, back = now-1-rng.Int64N(min(P, int64(time.Hour/time.Microsecond))), true
	default:
		// A failover to a replica hours behind.
		next, back = now-rng.Int64N(int64(5*time.Hour/time.Microsecond)), true
	}
	if !back {
		next = max(next, now)
	}
	next = max(next, epoch)
	d := time.Duration(next-epoch) * time.Microsecond
	if rng.IntN(5) == 0 {
		d += time.Duration(1 + rng.IntN(999))
	} else if next == now {
		d = at // the same instant, nanoseconds included
	}
	return d
}

// instants are the instants (µs) after now at which r's answer on its key
// may change: its window's end, GCRA's arrival times, a sliding log's
// expiries, and the instant a rejected request would be admitted.
func instants(m *model.Model, r backend.Request, now int64) []int64 {
	P := int64(r.Period / time.Microsecond)
	out := []int64{now - ((now%P)+P)%P + P}
	if s, ok := m.Stored(r.Key); ok {
		switch s.Algorithm {
		case backend.GCRA:
			B := r.Burst
			if B == 0 {
				B = r.Limit
			}
			T := (P + r.Limit - 1) / r.Limit
			if tau := T * B; tau/B == T {
				out = append(out, s.TAT, s.TAT-tau+T, s.TAT-tau+2*T)
			}
		case backend.SlidingWindow, backend.FixedWindow:
			out = append(out, s.Start+P, s.Start+2*P)
		case backend.SlidingLog:
			for _, u := range s.Log {
				out = append(out, u.T+P)
			}
		case backend.RollingWindow:
			for i := range s.Buckets {
				out = append(out, (s.Last+int64(i)+1)*s.W)
			}
		case backend.Concurrency:
			for _, l := range s.Leases {
				out = append(out, l.Exp)
			}
		}
	}
	for _, c := range []int64{1, r.Limit} {
		probe := r
		probe.Cost, probe.Force, probe.Shadow = c, false, false
		if res := m.Evaluate(now, []backend.Request{probe}); !res[0].Allowed && res[0].RetryAfter > 0 {
			out = append(out, now+int64(res[0].RetryAfter/time.Microsecond))
		}
	}
	var after []int64
	for _, t := range out {
		if t > now && t-now < int64(200*24*time.Hour/time.Microsecond) {
			after = append(after, t)
		}
	}
	return after
}
