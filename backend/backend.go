// Package backend defines the contract between ceiling's middleware and the
// stores that keep rate-limit state: one [Backend.Decide] call decides every
// rule of a request atomically, all or nothing.
//
// The package has no dependencies so that every backend (the embedded
// memory store, Redis, or your own) can import it without cycles. A backend
// proves it honours the contract by passing the conformance suite in
// package backendtest.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Algorithm selects how a rule counts. Every backend implements the same
// integer arithmetic (see ALGORITHMS.md beside this file), so the same state
// gives the same answer on memory and on Redis.
//
// The values are part of the API (configuration files may store them):
// RollingWindow is 0, the zero value; SlidingLog, SlidingWindow and
// FixedWindow keep 1, 2 and 3; GCRA, which was 0 before RollingWindow
// became the default, is 4.
type Algorithm uint8

const (
	// RollingWindow, the zero value, never admits more than Limit in any
	// rolling Period, with 19 integers of state per key whatever the limit.
	// The Period is cut into 16 aligned buckets; a request is admitted while
	// the current bucket and the 16 before it, plus its cost, hold at most
	// Limit. A full burst of Limit is admitted at once; a unit stops counting
	// up to Period/16 later than a sliding log would let it go, never
	// earlier. It is what a rule such as "10 per minute" promises a reader.
	RollingWindow Algorithm = iota
	// SlidingLog admits at most Limit in any rolling Period, exactly. It keeps
	// one timestamp per admitted unit, so it is right for small limits
	// (3 OTPs per 15 minutes, 30 chats per minute).
	SlidingLog
	// SlidingWindow weighs the previous fixed window by how much of it still
	// overlaps the rolling window, plus the current one: O(1) state and an
	// approximation of a rolling window that can over-admit under
	// adversarial timing (see ALGORITHMS.md for the bound).
	SlidingWindow
	// FixedWindow counts per aligned window of Period. It is the cheapest and
	// admits up to 2×Limit in a moment around a window boundary.
	FixedWindow
	// GCRA is the generic cell rate algorithm, a token bucket with one value
	// per key: a smooth rate of Limit per Period with Burst requests at once.
	// "30 per minute, burst 30" admits up to 59 in the first rolling minute:
	// it is a rate, not a rolling-window count.
	GCRA
	// Concurrency is not a rate: Limit is how many units a key may hold at
	// once, each acquisition a lease (Request.Lease) held until released
	// (a negative cost) or until it expires Period after it was acquired or
	// last renewed (acquired again). It limits work in flight (streams,
	// exports) exactly across instances, and a crashed holder's units come
	// back by themselves. [Algorithms] does not list it.
	Concurrency
)

// numAlgorithms bounds the rate algorithms, which [Algorithms] lists.
const numAlgorithms = GCRA + 1

// MaxLease bounds [Request.Lease], so that a lease id is exact in a
// double-precision Lua number.
const MaxLease = 1<<52 - 1

// Algorithms returns every rate Algorithm, in the order of their values, so
// that code covering each one (a test, a metric's label set) cannot miss one
// added later. [Concurrency], which limits units in flight rather than a
// rate, is not among them.
func Algorithms() []Algorithm {
	all := make([]Algorithm, numAlgorithms)
	for i := range all {
		all[i] = Algorithm(i)
	}
	return all
}

// String returns the algorithm's name as used in docs and metrics.
func (a Algorithm) String() string {
	switch a {
	case RollingWindow:
		return "rolling_window"
	case GCRA:
		return "gcra"
	case SlidingLog:
		return "sliding_log"
	case SlidingWindow:
		return "sliding_window"
	case FixedWindow:
		return "fixed_window"
	case Concurrency:
		return "concurrency"
	}
	return "unknown"
}

// Request asks for Cost units from one key under one rule's limit.
type Request struct {
	// Key is the stored key, already made fixed-length and free of raw
	// identifiers by the caller (ceiling passes "{tag}:rule"). Backends may
	// add their own prefix.
	Key string
	// Algorithm decides how Limit, Period and Burst are interpreted.
	Algorithm Algorithm
	// Limit is the number of units allowed per Period. It must be positive.
	Limit int64
	// Period is the window (or, for GCRA, the time in which Limit units are
	// emitted). Backends work in whole microseconds; it must be at least 1ms.
	Period time.Duration
	// Burst is GCRA's bucket size; zero means Limit. Other algorithms ignore it.
	Burst int64
	// Cost is the number of units to take. Zero peeks at the key's state
	// without consuming; a negative cost refunds units (never below empty).
	Cost int64
	// Force takes Cost even past the limit: the key goes into debt and later
	// requests wait it out. A forced request is always Allowed. It is how a
	// real cost known only after the work is settled.
	Force bool
	// Lease names the lease a [Concurrency] request acquires (a positive
	// Cost), renews (the same lease acquired again) or releases (a negative
	// Cost): 1..[MaxLease], unique per acquisition. Required when Cost is
	// not zero; other algorithms ignore it.
	Lease int64
	// Stamp ties a refund (a negative Cost) to the admission it undoes: the
	// [Result.Stamp] that admission returned, on the same key under the
	// same rule. The refund then gives back only units that admission
	// placed and that still count, never units another request took since
	// (nothing, once they have stopped counting). Zero gives back the
	// newest units (a refund tied to no admission). Other costs ignore it.
	// A stamp names an instant, a bucket or a window, not one admission:
	// the backend cannot tell the admission's units from others placed at
	// the same stamp, so a stamped refund must not exceed the admission's
	// cost and must be applied at most once (a refund whose reply was lost
	// is sent again only with a [Request.Once]); one that is larger, or
	// applied twice, gives back other requests' units. The limiter's Settle
	// keeps to both.
	// Its magnitude must stay below 2^53, as every stamp a backend returns
	// does, so that it is exact in a double-precision Lua number.
	Stamp int64
	// Once, when not zero, names a settlement (a refund, or a Forced
	// charge, of a rate algorithm) and the reservation it settles (the
	// admission, Cost > 0 and not Forced, that took the units), so that
	// the settlement takes effect at most once however often it is
	// delivered, even across a restart that lost the backend's data:
	//   - A reservation with Once o that places units (admitted, in a
	//     call that is admitted) writes a ticket for o on its key,
	//     atomically with its admission, kept [TicketKept] of Period: as
	//     long as its units can count.
	//   - A refund with Once o is applied only while o's ticket stands on
	//     its key, and consumes it in the same write, leaving nothing.
	//     With no ticket (already applied, expired, or lost with the
	//     backend's data, which lost the reservation's units too) it is
	//     answered as a peek: nothing comes back. A refund of units
	//     reserved without a Once goes without one.
	//   - A Forced charge with Once o consumes o's ticket, if any, and
	//     leaves a record of o kept [OnceKept] of Period (twice Period,
	//     at most [OnceHold]) after it was applied; while that record
	//     stands, another delivery is answered as a peek. It is applied
	//     without a ticket too: a charge is owed whether or not the
	//     reservation's units still count.
	//
	// A key's tickets are thus bounded by its reservations that hold
	// units, and its records by its forced charges, each of which adds
	// units that count: never by how often a key refunds. A request
	// answered as a peek is Allowed, with the key's state as a peek
	// would report it (Stamp 0). Within one call, a request sees the
	// tickets and records its call's earlier requests left; a call that
	// is rejected writes and consumes none.
	//
	// It makes a settlement safe to send again after any error, including
	// one sent and not answered ([ErrUnread], a lost connection, a
	// timeout): the caller repeats it unchanged, with the same Once. A
	// refund is applied once whenever it arrives while the ticket stands;
	// a forced charge only while its record surely holds: up to
	// OnceKept(Period) after the first delivery was sent, less the time a
	// repeat takes to be applied. A stamped refund sent twice without
	// Once gives back other requests' units (see Stamp). Pick Once at
	// random from a large space, unique per reservation across every
	// process that shares the backend. A Once on any other request (a
	// peek, a [Concurrency] request, which a lease id already names) is
	// an invalid request.
	Once int64
	// Shadow evaluates the request and reports whether it fits, but its
	// rejection never blocks the other requests of the call: a shadow rule
	// is being rolled out and must not refuse traffic yet. It consumes only
	// when it fits and the call is admitted.
	Shadow bool
}

// Result is a backend's answer for one Request. Durations, not timestamps,
// so that callers never compare their clock with the backend's.
type Result struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Limit echoes the request's limit (the quota for headers).
	Limit int64
	// Remaining is how many units a request could still take right now,
	// after this one; never negative.
	Remaining int64
	// ResetAfter is the time until the key is back to its full quota.
	ResetAfter time.Duration
	// RetryAfter is, for a rejected request, the time until the same request
	// would be admitted if nothing else happened. Zero when Allowed;
	// [Never] when the cost can never fit (cost above the limit).
	RetryAfter time.Duration
	// NextAfter is the time until the key can take at least one more unit:
	// zero when Remaining > 0, otherwise what RetryAfter would be for a
	// request of cost 1 on the state this result reports. It is what the
	// IETF RateLimit field's "t" advertises; a rejected request of cost 1
	// has NextAfter == RetryAfter. Never negative, never [Never].
	NextAfter time.Duration
	// Stamp says where an admitted request with a positive Cost placed its
	// units, in the backend's microseconds (ALGORITHMS.md gives it for each
	// algorithm): a later refund of those units passes it as
	// [Request.Stamp]. Zero when nothing was placed.
	Stamp int64
	// Unread reports that the backend answered without reading this key's
	// state, because another request of the call was refused from a cache
	// (the Redis deny cache). Allowed is true and Remaining and ResetAfter
	// are unknown: callers must not advertise them.
	Unread bool
	// Cached reports that the whole call was answered from a cache in this
	// process (the Redis deny cache), without asking the backend. Such an
	// answer is not the backend's: it says nothing about the backend's
	// health, so the limiter's circuit breaker neither counts it as a
	// success nor lets it close.
	Cached bool
}

// Never is the RetryAfter of a request whose cost exceeds what the rule can
// ever admit.
const Never time.Duration = -1

// Backend stores rate-limit state and decides requests.
//
// Being limited is not an error: a rejection is a Result with Allowed false.
// An error means the backend could not decide (unreachable, timed out,
// protocol failure); the middleware then applies its fail mode.
//
// Timeouts. A backend that does I/O returns by its context's deadline, with
// one exception: once it has written a call, it reads the reply that came
// however late this process gets to it, and waits for one at most as long
// after the write as the deadline allowed when Decide was called. A call it
// never wrote (the deadline passed while this process waited for a CPU or
// for a connection) fails with an error wrapping [ErrNotSent], and one whose
// reply this process was too busy to read in time with [ErrUnread]: that is
// the caller's process at fault, not the backend, and the limiter sheds the
// request rather than blame the backend or apply a fail mode.
//
// Implementations must be safe for simultaneous use by multiple goroutines.
type Backend interface {
	// Decide decides every request atomically and all or nothing: if any
	// request that is neither Forced nor Shadow is rejected, no request
	// consumes anything
	// (each Result still reports its own rule's state). It returns one Result
	// per Request, in order. On error the results are undefined.
	Decide(ctx context.Context, reqs []Request) ([]Result, error)
	// Reset forgets the state of the given keys, restoring their full quota.
	Reset(ctx context.Context, keys ...string) error
}

// InProcess is implemented by backends that answer from process memory and
// cannot block or fail for I/O reasons. The middleware skips the timeout and
// circuit breaker for them.
type InProcess interface {
	InProcess() bool
}

// DecideInto is implemented by backends that can decide without allocating.
// Its method is [Backend.Decide] writing the results into a slice the caller
// owns, so that a hot path reuses one buffer: results must have at least
// len(reqs) elements, the first len(reqs) are overwritten, and the
// semantics are exactly those of Decide. The middleware uses it when the
// backend offers it.
type DecideInto interface {
	DecideInto(ctx context.Context, reqs []Request, results []Result) error
}

// CachedDecider is implemented by a backend that remembers rejections in
// process, as the Redis store's deny cache does. DecideCached decides reqs
// from that memory alone, with no I/O, whether or not the server can be
// reached: when the call would be rejected from it (a request on a key
// rejected until a time still to come), it writes results as Decide would
// have answered from the cache, every Result with Cached set, and returns
// true; otherwise it returns false and leaves results alone. results must
// have at least len(reqs) elements.
//
// The limiter asks it before it decides a call by a fail mode, so that a
// key the backend refused stays refused while the backend cannot be asked
// (a spent key is not admitted by FailOpen during an outage). Such an
// answer is no evidence about the backend's health.
type CachedDecider interface {
	DecideCached(reqs []Request, results []Result) bool
}

// Spread is implemented by a backend whose state lives on several servers
// that fail independently (Redis Cluster: each master holds some of the
// hash slots). SpreadKeys returns variants of key, one stored on each of
// the servers as the backend routes keys now, so that one call deciding
// all of them reaches every server. The limiter's background probe decides
// a canary on each, so that its circuit breaker closes only once every
// server can decide, not as soon as the one that holds a lone canary
// answers while keys on another still fail.
type Spread interface {
	SpreadKeys(ctx context.Context, key string) ([]string, error)
}

// DefaultLogger is implemented by a backend that logs on its own (the Redis
// store: its client's lines): ceiling.New passes it the limiter's logger,
// which the backend uses unless it was given a logger of its own.
type DefaultLogger interface {
	UseDefaultLogger(*slog.Logger)
}

// ErrInvalidRequest wraps every error about a malformed Request (zero limit,
// period under 1ms, unknown algorithm).
var ErrInvalidRequest = errors.New("backend: invalid request")

// Validate reports whether r can be decided, naming the key and the
// faulty field.
func (r Request) Validate() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidRequest)
	case r.Limit <= 0 || r.Limit > MaxLimit:
		return fmt.Errorf("%w: key %q: limit %d outside 1..%d", ErrInvalidRequest, r.Key, r.Limit, MaxLimit)
	case r.Period < time.Millisecond || r.Period > MaxPeriod:
		return fmt.Errorf("%w: key %q: period %v outside 1ms..%v", ErrInvalidRequest, r.Key, r.Period, MaxPeriod)
	case r.Burst < 0 || r.Burst > MaxLimit:
		return fmt.Errorf("%w: key %q: burst %d outside 0..%d", ErrInvalidRequest, r.Key, r.Burst, MaxLimit)
	case r.Algorithm > Concurrency:
		return fmt.Errorf("%w: key %q: unknown algorithm %d", ErrInvalidRequest, r.Key, r.Algorithm)
	case r.Algorithm == Concurrency && r.Cost != 0 && (r.Lease < 1 || r.Lease > MaxLease):
		return fmt.Errorf("%w: key %q: lease %d outside 1..%d", ErrInvalidRequest, r.Key, r.Lease, int64(MaxLease))
	case r.Cost > MaxLimit || r.Cost < -MaxLimit:
		return fmt.Errorf("%w: key %q: cost %d outside ±%d", ErrInvalidRequest, r.Key, r.Cost, MaxLimit)
	case r.Once != 0 && (r.Algorithm == Concurrency || r.Cost == 0):
		return fmt.Errorf("%w: key %q: once %d on a request that is neither a reservation nor a settlement (a peek or a lease)", ErrInvalidRequest, r.Key, r.Once)
	case r.Stamp > maxStamp || r.Stamp < -maxStamp:
		return fmt.Errorf("%w: key %q: stamp %d outside ±%d", ErrInvalidRequest, r.Key, r.Stamp, maxStamp)
	case r.Algorithm == GCRA && r.Burst > r.Limit && gcraTolerance(r) > maxTolerance:
		return fmt.Errorf("%w: key %q: burst %d at %d per %v spans more than %v", ErrInvalidRequest, r.Key, r.Burst, r.Limit, r.Period, time.Duration(maxTolerance)*time.Microsecond)
	}
	return nil
}

// maxStamp bounds [Request.Stamp]: a stamp is an instant in µs, at most
// now + 2^52 (GCRA's saturated debt) while now stays under 2^52.
const maxStamp = 1<<53 - 1

// maxTolerance bounds GCRA's burst tolerance (Burst × emission interval, in
// µs) so that a timestamp plus it stays exact in a double: ten times
// MaxPeriod, far below 2^53 µs. A burst up to the limit never exceeds it
// (the tolerance is then at most Period + Limit µs), so only a larger burst
// pays for the division.
const maxTolerance = 10 * int64(MaxPeriod/time.Microsecond)

// gcraTolerance is Burst × ceil(Period/Limit) in µs, saturating instead of
// overflowing.
func gcraTolerance(r Request) int64 {
	b := r.Burst
	if b == 0 {
		b = r.Limit
	}
	p := int64(r.Period / time.Microsecond)
	t := (p + r.Limit - 1) / r.Limit
	if t > 0 && b > maxTolerance/t {
		return maxTolerance + 1
	}
	return b * t
}

// Limits that keep every algorithm's arithmetic exact in a double-precision
// Lua number (2^53) as well as in int64.
const (
	MaxLimit  = 1_000_000_000
	MaxPeriod = 90 * 24 * time.Hour
)

// OnceHold bounds how long a backend keeps the record of a forced charge's
// [Request.Once]: a resend of a settlement is a retry over a slow moment,
// not the ride-out of an outage.
const OnceHold = time.Minute

// OnceKept is how long a backend keeps the record of a forced charge of a
// rule of period: twice the period, at most [OnceHold].
func OnceKept(period time.Duration) time.Duration { return min(2*period, OnceHold) }

// TicketKept is how long a backend keeps the ticket of a reservation of a
// rule of period ([Request.Once]): twice the period, as long as a refund of
// its units can give anything back (a sliding window's previous window
// counts until two periods after it began).
func TicketKept(period time.Duration) time.Duration { return 2 * period }
