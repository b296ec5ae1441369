// Package backendtest is the conformance suite every ceiling backend passes:
// the same hand-computed table of (time, rule, cost) → (allowed, remaining,
// reset, retry-after) for every algorithm, all-or-nothing decisions,
// exactness under concurrency, and the documented weaknesses of the
// windowed algorithms, all driven by a fake clock.
//
// A backend's test is a few lines:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T, now func() time.Time) backend.Backend {
//			s := memory.New(memory.WithClock(now))
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The expected values are computed by hand from ALGORITHMS.md in package
// backend, never by calling an implementation, so two backends that pass
// agree with the definitions and with each other.
package backendtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// NewBackend builds the backend under test for one subtest. It must make
// the backend read time only from now, and should register any cleanup
// (closing the backend) with t.Cleanup. Several subtests may share the
// underlying storage (one Redis server): the suite never reuses a key
// across subtests and never relies on an empty store.
type NewBackend = func(t *testing.T, now func() time.Time) backend.Backend

// Run runs the conformance suite against the backends newBackend builds.
// Every subtest builds its own backend with its own [Clock] starting at
// [Epoch]. The suite takes well under a second on the memory backend.
func Run(t *testing.T, newBackend NewBackend) {
	t.Helper()
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	s := &suite{newBackend: newBackend, nonce: hex.EncodeToString(nonce[:])}
	t.Run("Table", s.testTable)
	t.Run("GCRABurst", s.testGCRABurst)
	t.Run("LimitChange", s.testLimitChange)
	t.Run("PeekDoesNotConsume", s.testPeek)
	t.Run("ResetRestoresFullQuota", s.testReset)
	t.Run("RefundGivesBack", s.testRefund)
	t.Run("RefundNeverBelowEmpty", s.testRefundFloor)
	t.Run("ForceChargesPastLimit", s.testForce)
	t.Run("EstimateThatDoesNotFit", s.testEstimateRefused)
	t.Run("SettleBelowEstimate", s.testSettle)
	t.Run("SettleAboveEstimate", s.testSettleAbove)
	t.Run("SettleSeveralRulesInOneCall", s.testSettleBatch)
	t.Run("ResetForgivesDebt", s.testResetForgivesDebt)
	t.Run("RefundAfterRejection", s.testRefundAfterRejection)
	t.Run("CostAboveLimitNeverFits", s.testNever)
	t.Run("AllOrNothing", s.testAllOrNothing)
	t.Run("AllOrNothingForced", s.testAllOrNothingForced)
	t.Run("SameKeyTwiceInOneCall", s.testSameKey)
	t.Run("SameKeyUnderTwoPeriods", s.testSameKeyUnderTwoPeriods)
	t.Run("HugeGCRACosts", s.testHugeGCRACosts)
	t.Run("CountSaturates", s.testCountSaturates)
	t.Run("ShadowNeverBlocks", s.testShadow)
	t.Run("EmptyCall", s.testEmptyCall)
	t.Run("InvalidRequests", s.testInvalid)
	t.Run("Concurrent1000On100", s.testConcurrent)
	t.Run("FixedWindowBoundaryBurst", s.testFixedWindowBurst)
	t.Run("SlidingWindowOverAdmission", s.testSlidingWindowBound)
	t.Run("SlidingLogRandomized", s.testSlidingLogRandomized)
	t.Run("RollingWindowCeiling", s.testRollingWindowCeiling)
	t.Run("DecideIntoMatchesDecide", s.testDecideInto)
	t.Run("Stamps", s.testStamps)
	t.Run("StampedSettlement", s.testStampedSettlement)
	t.Run("StampNoLongerCounts", s.testStampNoLongerCounts)
	t.Run("SameSettlementTwiceRefundsOnce", s.testSettleOnce)
	t.Run("SameChargeTwiceChargesOnce", s.testChargeOnce)
	t.Run("OnceRecordHeldForOnceHold", s.testOnceHold)
	t.Run("RefundWithoutTicketGivesNothing", s.testRefundWithoutTicket)
	t.Run("TicketsBoundedByReservations", s.testTicketsBounded)
	t.Run("RollingWindowEmptiedInOneCall", s.testRollingEmptiedInOneCall)
	t.Run("ClockBehind", s.testClockBehind)
	t.Run("GCRAAtTheHorizon", s.testGCRAAtTheHorizon)
	t.Run("Concurrency", s.testConcurrency)
	t.Run("ConcurrencyAllOrNothing", s.testConcurrencyAllOrNothing)
	t.Run("ConcurrencyRace", s.testConcurrencyRace)
}

var algorithms = []backend.Algorithm{backend.RollingWindow, backend.GCRA, backend.SlidingLog, backend.SlidingWindow, backend.FixedWindow}

type suite struct {
	newBackend NewBackend
	nonce      string
}

// env is one subtest's world: its clock, its backend and its key space.
type env struct {
	t     *testing.T
	clock *Clock
	b     backend.Backend
	ns    string
}

func (s *suite) env(t *testing.T) *env {
	t.Helper()
	c := NewClock(Epoch)
	b := s.newBackend(t, c.Now)
	if b == nil {
		t.Fatal("backendtest: newBackend returned nil")
	}
	return &env{t: t, clock: c, b: b, ns: "backendtest:" + s.nonce + ":" + sanitize(t.Name())}
}

// sanitize keeps key names printable and free of Redis Cluster hash tags.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '/':
			return r
		}
		return '_'
	}, name)
}

// key returns a key unique to this subtest.
func (e *env) key(name string) string { return e.ns + ":" + name }

// at sets the clock to Epoch+d.
func (e *env) at(d time.Duration) { e.clock.Set(Epoch.Add(d)) }

func (e *env) decide(reqs ...backend.Request) []backend.Result {
	e.t.Helper()
	res, err := e.b.Decide(context.Background(), reqs)
	if err != nil {
		e.t.Fatalf("Decide(%v): %v", reqs, err)
	}
	if got, want := len(res), len(reqs); got != want {
		e.t.Fatalf("Decide returned %d results for %d requests", got, want)
	}
	return res
}

func (e *env) one(r backend.Request) backend.Result {
	e.t.Helper()
	return e.decide(r)[0]
}

// peek asks for r's state without consuming.
func (e *env) peek(r backend.Request) backend.Result {
	e.t.Helper()
	r.Cost, r.Force = 0, false
	return e.one(r)
}

// remaining peeks and returns r's remaining quota.
func (e *env) remaining(r backend.Request) int64 {
	e.t.Helper()
	return e.peek(r).Remaining
}

// req builds a request; the period and limit are the suite's usual ones
// unless changed by the caller.
func req(key string, alg backend.Algorithm, limit int64, period time.Duration, cost int64) backend.Request {
	return backend.Request{Key: key, Algorithm: alg, Limit: limit, Period: period, Cost: cost}
}

// us is n microseconds, the unit ALGORITHMS.md computes in.
func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// want is an expected Result, in microseconds for readability against
// ALGORITHMS.md. retry is ignored when ok; never means backend.Never; next
// is NextAfter (zero whenever rem > 0).
type want struct {
	ok                 bool
	rem                int64
	reset, retry, next int64
	never              bool
}

func (w want) result(limit int64) backend.Result {
	r := backend.Result{Allowed: w.ok, Limit: limit, Remaining: w.rem, ResetAfter: us(w.reset), NextAfter: us(w.next)}
	switch {
	case w.never:
		r.RetryAfter = backend.Never
	case !w.ok:
		r.RetryAfter = us(w.retry)
	}
	return r
}

// check compares a result with the expected one. Cached says where an
// answer came from, not what it is, so it is not compared; nor is Stamp,
// which the stamp tests (stamp.go) check on their own.
func check(t *testing.T, label string, got, want backend.Result) {
	t.Helper()
	got.Cached, got.Stamp, want.Stamp = false, 0, 0
	if got != want {
		t.Errorf("%s:\n got %+v\nwant %+v", label, got, want)
	}
}
