package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/internal/model"
)

// Environment knobs of [Differential.Run] (see README.md beside this file).
const (
	// SequencesEnv sets how many random sequences Run drives per backend,
	// instead of the fixed number CI runs.
	SequencesEnv = "CEILING_MODEL_SEQUENCES"
	// SeedEnv sets the seed of the first sequence (the default is fixed, so
	// that CI runs the same sequences every time); "random" picks one.
	SeedEnv = "CEILING_MODEL_SEED"
	// ShrinkEnv sets how long shrinking one failing sequence may take (a
	// Go duration, such as "10m"), instead of [DefaultShrinkFor]; the
	// process's budget for all shrinking is twice that.
	ShrinkEnv = "CEILING_MODEL_SHRINK"
)

// DefaultShrinkFor is how long Run shrinks a failing sequence at most,
// unless [Differential.ShrinkFor] or [ShrinkEnv] says otherwise. The
// shrinking of all Runs of a test process together takes at most twice
// that, and none outlives the test binary's -timeout: a backend broken for
// every target of a package fails the run within a few minutes, its later
// targets printing their sequences unshrunk. A shrink cut short says so.
const DefaultShrinkFor = time.Minute

// DefaultCallTimeout is how long a Decide, Reset or Inspect of a
// differential step may take before the step fails as one that does not
// return (a script in an endless loop), unless [Differential.CallTimeout]
// says otherwise.
const DefaultCallTimeout = 10 * time.Second

// DefaultSequences is how many sequences Run drives when neither
// [Differential.Sequences] nor [SequencesEnv] says otherwise.
const DefaultSequences = 200

// Step is one operation of a differential sequence: at Epoch+At, either a
// Decide call of the requests or a Reset of the keys.
type Step struct {
	At     time.Duration
	Decide []backend.Request
	Reset  []string
}

// Target is one backend under test, built for one sequence.
type Target struct {
	Backend backend.Backend
	// Inspect, when set, compares what the backend stores for key with the
	// model's state after a step that named the key: want is the state
	// written last (ok false: the key holds none, it was never written or
	// its last write took it back to full) and written reports that this
	// step wrote it. It returns an error describing a difference. The
	// model is internal to this module, so only its own backends set
	// Inspect; any backend is compared result by result without it.
	Inspect func(key string, want model.State, ok, written bool) error
}

// Differential is the randomized differential test of a backend against
// the reference model of ALGORITHMS.md (package model): random sequences
// of Decide and Reset calls, with random rules on a few colliding keys and
// time steps that land on window boundaries and GCRA emission instants,
// compared result by result. A disagreement is shrunk to a minimal
// sequence and printed as a Go test ready to paste.
type Differential struct {
	// New builds a fresh backend reading time only from now. It is called
	// once per sequence, and once per replay while shrinking; backends may
	// share storage (one Redis) as long as each one has its own key space.
	New func(t testing.TB, now func() time.Time) Target
	// Keys are the keys sequences use (default a, b, c, d). Give a Redis
	// Cluster keys of two hash slots ({x}a, {y}b, ...).
	Keys []string
	// DenyCache says the backend answers from the Redis deny cache; the
	// model then answers as that cache is documented to.
	DenyCache bool
	// Split, when set, says which calls the backend splits across Redis
	// Cluster hash slots, whose rejections its deny cache does not learn.
	Split func([]backend.Request) bool
	// Sequences is how many sequences Run drives; zero means
	// [DefaultSequences], unless [SequencesEnv] is set, which wins.
	Sequences int
	// Seed is the seed of the first sequence; zero means 1, unless
	// [SeedEnv] is set, which wins.
	Seed uint64
	// Paste is the Go expression a printed regression test calls Replay on
	// (for example "clusterDifferential(t)").
	Paste string
	// ShrinkFor bounds the shrinking of a failing sequence; zero means
	// [DefaultShrinkFor], unless [ShrinkEnv] is set, which wins.
	ShrinkFor time.Duration
	// CallTimeout bounds each call a step makes on the backend; zero means
	// [DefaultCallTimeout]. A call still running then fails the sequence
	// (its context is cancelled; a backend that ignores that is abandoned,
	// still running), and the sequence is printed up to that step, not
	// shrunk: a backend that hung may stay hung (miniredis holds its lock
	// through an endless script), so later replays prove nothing.
	CallTimeout time.Duration
}

// Run drives the sequences and fails at the first disagreement, printing
// the shrunk sequence.
func (d Differential) Run(t *testing.T) {
	t.Helper()
	n, seed := d.Sequences, d.Seed
	if n == 0 {
		n = DefaultSequences
	}
	if seed == 0 {
		seed = 1
	}
	if v := os.Getenv(SequencesEnv); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 {
			t.Fatalf("%s=%q: want a positive number", SequencesEnv, v)
		}
		n = k
	}
	switch v := os.Getenv(SeedEnv); v {
	case "":
	case "random":
		seed = rand.Uint64()
	default:
		k, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number or \"random\"", SeedEnv, v)
		}
		seed = k
	}
	shrinkFor := d.ShrinkFor
	if shrinkFor == 0 {
		shrinkFor = DefaultShrinkFor
	}
	if v := os.Getenv(ShrinkEnv); v != "" {
		k, err := time.ParseDuration(v)
		if err != nil || k < 0 {
			t.Fatalf("%s=%q: want a duration such as 10m", ShrinkEnv, v)
		}
		shrinkFor = k
	}
	testEnd, _ := t.Deadline()
	if msg := d.run(t, n, seed, shrinkFor, testEnd); msg != "" {
		t.Fatal(msg)
	}
}

// run is Run after its knobs: it returns the failure message, or "" when
// every sequence agrees. testEnd, when not zero, is when the test binary
// times out; shrinking stops well before it.
func (d Differential) run(t testing.TB, n int, seed uint64, shrinkFor time.Duration, testEnd time.Time) string {
	keys := d.keys()
	steps, calls := 0, 0
	for i := range uint64(n) {
		seq := generate(rand.New(rand.NewPCG(seed+i, 0x5eed)), keys)
		if err := d.check(t, seq, time.Time{}); err != nil {
			return fmt.Sprintf("the backend disagrees with the model on sequence %d (seed %d):\n%v\n\n%s",
				i, seed+i, err, d.report(t, seq, err, shrinkFor, testEnd))
		}
		steps += len(seq)
		for _, st := range seq {
			calls += len(st.Decide)
		}
	}
	t.Logf("%d sequences from seed %d, %d steps, %d requests: no disagreement", n, seed, steps, calls)
	return ""
}

// report shrinks seq, which failed with err, within the time it may take
// and describes the outcome: how far it got, whether it was cut short (so
// that nobody takes a case for minimal that may not be), the failure, and
// the case as a test to paste.
func (d Differential) report(t testing.TB, seq []Step, err error, shrinkFor time.Duration, testEnd time.Time) string {
	var b strings.Builder
	var small []Step
	var serr error
	if h, ok := errors.AsType[*hangError](err); ok {
		small, serr = h.upTo(seq), err
		fmt.Fprintf(&b, "Not shrunk: step %d hung or timed out, and a backend that hung may stay hung (miniredis keeps its lock through "+
			"an endless script, Redis answers BUSY), so replays would prove nothing. The sequence up to it, %d of %d steps, fails with:\n%v",
			h.step, len(small), len(seq), serr)
	} else {
		deadline, why := shrinkBudget.take(shrinkFor, testEnd)
		start := time.Now()
		res := d.shrink(t, seq, err, deadline)
		shrinkBudget.spent(time.Since(start))
		small, serr = res.steps, res.err
		took := time.Since(start).Round(time.Millisecond)
		switch {
		case res.hung:
			fmt.Fprintf(&b, "Shrunk from %d to %d steps in %d replays (%v), then stopped: the last replay hung or timed out at its step %d, "+
				"and a backend that hung may stay hung. It may not be minimal. It fails with:\n%v", len(seq), len(small), res.replays, took, len(small)-1, serr)
		case res.cut:
			fmt.Fprintf(&b, "Shrunk from %d to %d steps in %d replays, then cut short by %s (%v): it may not be minimal. It fails with:\n%v",
				len(seq), len(small), res.replays, why, took, serr)
		default:
			fmt.Fprintf(&b, "Shrunk from %d to %d steps in %d replays (%v), it fails with:\n%v", len(seq), len(small), res.replays, took, serr)
		}
	}
	fmt.Fprintf(&b, "\n\nPaste it as a regression test:\n\n%s", d.goTest(small))
	return b.String()
}

// shrinkBudget is the time the shrinking of all Runs of this process may
// still take: a backend broken for every target (five Redis deployments)
// must not shrink for five times its deadline.
var shrinkBudget budget

type budget struct {
	mu   sync.Mutex
	used time.Duration
}

// take returns when a shrink starting now must stop, and why then: after
// shrinkFor, within the process's budget of twice [DefaultShrinkFor] or
// of shrinkFor, whichever is more, and a minute (or a tenth of the time
// left, if less) before testEnd.
func (b *budget) take(shrinkFor time.Duration, testEnd time.Time) (time.Time, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	end, why := now.Add(shrinkFor), fmt.Sprintf("the %v shrink deadline", shrinkFor)
	total := 2 * max(shrinkFor, DefaultShrinkFor)
	if left := total - b.used; left < shrinkFor {
		end, why = now.Add(max(0, left)), fmt.Sprintf("this process's %v budget for shrinking (spent on earlier failures)", total)
	}
	if !testEnd.IsZero() {
		stop := testEnd.Add(-min(time.Minute, testEnd.Sub(now)/10))
		if stop.Before(end) {
			end, why = stop, "the test binary's -timeout"
		}
	}
	return end, why
}

func (b *budget) spent(d time.Duration) {
	b.mu.Lock()
	b.used += d
	b.mu.Unlock()
}

// Replay runs one sequence, as printed by Run, and fails on a
// disagreement.
func (d Differential) Replay(t *testing.T, steps []Step) {
	t.Helper()
	if err := d.check(t, steps, time.Time{}); err != nil {
		t.Fatal(err)
	}
}

func (d Differential) keys() []string {
	if len(d.Keys) > 0 {
		return d.Keys
	}
	return []string{"a", "b", "c", "d"}
}

// hangError is a step whose call on the backend did not return within
// the call timeout, or failed with a timeout or Redis's BUSY (a script
// that runs on): a backend that may stay hung.
type hangError struct {
	step int
	err  error
}

func (e *hangError) Error() string { return fmt.Sprintf("step %d: %v", e.step, e.err) }

// upTo is steps up to the one that hung (all of them if none did: a
// replay that ran out of time between calls).
func (e *hangError) upTo(steps []Step) []Step {
	if e.step < 0 || e.step >= len(steps) {
		return steps
	}
	return steps[:e.step+1]
}

// hangGrace is how long a call whose context ended may take to return
// before it is abandoned.
const hangGrace = 500 * time.Millisecond

// inflight is the call of a replay on the backend that is running: its
// step, what it is (built only for a report) and when it started.
type inflight struct {
	step  int
	what  func() string
	start time.Time
}

// calls makes a replay's calls on the backend, with the replay's context,
// and keeps the one running where check's watchdog sees it.
type calls struct {
	ctx context.Context
	cur atomic.Pointer[inflight]
}

// do makes one call. One that fails with a timeout (its own, or its
// context's, which check cancels when the call outlives the call timeout
// or the replay its stop) or with Redis's BUSY, the reply of a server
// running a script past its time limit, fails as a *hangError.
func (c *calls) do(step int, what func() string, call func(ctx context.Context) error) error {
	c.cur.Store(&inflight{step: step, what: what, start: time.Now()})
	err := call(c.ctx)
	c.cur.Store(nil)
	var ne net.Error
	if err != nil && (c.ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) || strings.Contains(err.Error(), "BUSY ")) {
		return &hangError{step: step, err: fmt.Errorf("%s: %w", what(), err)}
	}
	return err
}

// check runs steps on a fresh target and a fresh model and returns the
// first disagreement. The steps run on a goroutine of their own, watched:
// a call on the backend that outlives the call timeout, or runs at stop
// (when not zero), has its context cancelled and, if it still has not
// returned hangGrace later, is abandoned (still running); either way the
// replay fails with a *hangError.
func (d Differential) check(t testing.TB, steps []Step, stop time.Time) error {
	timeout := d.CallTimeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	clock := NewClock(Epoch)
	target := d.New(t, clock.Now) // here: New may call t.Fatal
	ctx, cancel := context.WithCancel(context.Background())
	if !stop.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), stop)
	}
	defer cancel()
	c := &calls{ctx: ctx}
	done := make(chan error, 1)
	go func() { done <- d.replay(c, clock, target, steps) }()
	tick := time.NewTicker(max(timeout/20, time.Millisecond))
	defer tick.Stop()
	bound := fmt.Sprintf("within %v", timeout)
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if f := c.cur.Load(); f == nil || time.Since(f.start) < timeout {
				continue
			}
		case <-ctx.Done():
			bound = "by the replay's stop"
		}
		f := c.cur.Load()
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(hangGrace):
		}
		if f == nil {
			return &hangError{step: -1, err: errors.New("the replay did not end by its stop")}
		}
		return &hangError{step: f.step, err: fmt.Errorf("%s did not return %s (abandoned after %v)", f.what(), bound, time.Since(f.start).Round(time.Millisecond))}
	}
}

// replay is check's steps, on a goroutine of their own.
func (d Differential) replay(c *calls, clock *Clock, target Target, steps []Step) (err error) {
	var opts []model.Option
	if d.DenyCache {
		opts = append(opts, model.WithDenyCache())
	}
	if d.Split != nil {
		opts = append(opts, model.WithSplit(d.Split))
	}
	m := model.New(opts...)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the model panicked (a sequence outside ALGORITHMS.md's bounds): %v", p)
		}
	}()
	for i, st := range steps {
		at := Epoch.Add(st.At)
		clock.Set(at)
		now := at.UnixMicro()
		before := map[string]model.State{}
		for _, k := range stepKeys(st) {
			before[k], _ = m.Stored(k)
		}
		if st.Reset != nil {
			m.Reset(st.Reset...)
			what := func() string { return fmt.Sprintf("Reset(%q)", st.Reset) }
			if err := c.do(i, what, func(ctx context.Context) error { return target.Backend.Reset(ctx, st.Reset...) }); err != nil {
				if _, ok := errors.AsType[*hangError](err); ok {
					return err
				}
				return fmt.Errorf("step %d: %s: %v", i, what(), err)
			}
		} else {
			want, werr := m.Decide(now, st.Decide)
			var got []backend.Result
			gerr := c.do(i, func() string { return "Decide(" + goRequests(st.Decide, "") + ")" }, func(ctx context.Context) (err error) {
				got, err = target.Backend.Decide(ctx, slices.Clone(st.Decide))
				return err
			})
			if _, ok := errors.AsType[*hangError](gerr); ok {
				return gerr
			}
			switch {
			case werr != nil && !errors.Is(gerr, backend.ErrInvalidRequest):
				return fmt.Errorf("step %d: Decide(%s): error %v, want one wrapping backend.ErrInvalidRequest (%v)", i, goRequests(st.Decide, ""), gerr, werr)
			case werr != nil:
				continue
			case gerr != nil:
				return fmt.Errorf("step %d: Decide(%s): %v", i, goRequests(st.Decide, ""), gerr)
			case len(got) != len(want):
				return fmt.Errorf("step %d: %d results for %d requests", i, len(got), len(want))
			}
			for j := range want {
				if got[j] != want[j] {
					return fmt.Errorf("step %d (at %v), request %d of %s:\n got %+v\nwant %+v",
						i, st.At, j, goRequests(st.Decide, ""), got[j], want[j])
				}
			}
			if d.DenyCache && len(want) > 0 && want[0].Cached {
				// A cached answer changed nothing: the backend's own answer is
				// what the model evaluates now.
				if err := cacheSound(m.Evaluate(now, st.Decide), want); err != nil {
					return fmt.Errorf("step %d: %v", i, err)
				}
			}
		}
		if target.Inspect == nil {
			continue
		}
		for _, k := range stepKeys(st) {
			s, ok := m.Stored(k)
			written := ok && s.Written == now && !reflect.DeepEqual(s, before[k])
			what := func() string { return fmt.Sprintf("Inspect(%q)", k) }
			if err := c.do(i, what, func(context.Context) error { return target.Inspect(k, s, ok, written) }); err != nil {
				if _, ok := errors.AsType[*hangError](err); ok {
					return err
				}
				return fmt.Errorf("step %d (at %v), key %q after %s: %v", i, st.At, k, describeStep(st), err)
			}
		}
	}
	return nil
}

// cacheSound checks the deny cache's rejections against what the backend
// itself would answer: the cache must never refuse a request the backend
// would admit, nor promise a wait longer than the backend's.
func cacheSound(pure, cached []backend.Result) error {
	for i := range cached {
		if cached[i].Allowed {
			continue
		}
		if pure[i].Allowed || (pure[i].RetryAfter != backend.Never && pure[i].RetryAfter < cached[i].RetryAfter) {
			return fmt.Errorf("the deny cache rejects request %d for %v where the backend says %+v", i, cached[i].RetryAfter, pure[i])
		}
	}
	return nil
}

func stepKeys(st Step) []string {
	var keys []string
	for _, r := range st.Decide {
		keys = append(keys, r.Key)
	}
	keys = append(keys, st.Reset...)
	slices.Sort(keys)
	return slices.Compact(keys)
}

func describeStep(st Step) string {
	if st.Reset != nil {
		return fmt.Sprintf("Reset(%q)", st.Reset)
	}
	return goRequests(st.Decide, "")
}

// shrunk is the outcome of shrink: the smallest failing sequence found,
// its failure, how many replays it took, and whether shrinking stopped
// before it was done: cut at its deadline, or after a replay that hung.
type shrunk struct {
	steps   []Step
	err     error
	replays int
	cut     bool
	hung    bool
}

// shrink reduces a failing sequence while it still fails: fewer steps,
// fewer requests, then simpler requests and instants, until nothing
// simpler fails or deadline passes (a replay running then is cut off and
// proves nothing). A replay that hangs ends it: the backend may stay hung.
// failed is the failure steps had when Run ran them.
func (d Differential) shrink(t testing.TB, steps []Step, failed error, deadline time.Time) shrunk {
	res := shrunk{steps: steps}
	stopped := func() bool {
		if !res.hung && !time.Now().Before(deadline) {
			res.cut = true
		}
		return res.cut || res.hung
	}
	// fails replays s; a replay cut off by the deadline is no failure.
	fails := func(s []Step) error {
		res.replays++
		err := d.check(t, s, deadline)
		if err == nil || stopped() {
			return nil
		}
		if h, ok := errors.AsType[*hangError](err); ok {
			res.hung = true
			s = h.upTo(s)
			res.steps, res.err = s, err
			return nil
		}
		return err
	}
	switch err := fails(steps); {
	case err != nil:
		res.err = err
	case res.cut:
		res.err = failed // not replayed in time: the failure Run saw
		return res
	case !res.hung:
		res.err = fmt.Errorf("the failure did not reproduce on a fresh backend: %w", failed)
		return res
	}
	best := res.steps
	try := func(s []Step) bool {
		if stopped() {
			return false
		}
		if err := fails(s); err != nil {
			best, res.steps, res.err = s, s, err
			return true
		}
		return false
	}
	for progress := true; progress && !stopped(); {
		progress = false
		// Drop runs of steps, halving the run length.
		for size := len(best) / 2; size >= 1; size /= 2 {
			for i := 0; i+size <= len(best); {
				if try(slices.Delete(slices.Clone(best), i, i+size)) {
					progress = true
				} else {
					i += size
				}
			}
		}
		// Drop requests and keys from calls.
		for i := range best {
			for j := 0; j < len(best[i].Decide) && len(best[i].Decide) > 1; {
				s := cloneSteps(best)
				s[i].Decide = slices.Delete(s[i].Decide, j, j+1)
				if try(s) {
					progress = true
				} else {
					j++
				}
			}
			for j := 0; j < len(best[i].Reset) && len(best[i].Reset) > 1; {
				s := cloneSteps(best)
				s[i].Reset = slices.Delete(s[i].Reset, j, j+1)
				if try(s) {
					progress = true
				} else {
					j++
				}
			}
		}
		// Simpler requests and instants.
		for i := range best {
			if at := best[i].At.Truncate(time.Microsecond); at != best[i].At {
				s := cloneSteps(best)
				s[i].At = at
				progress = try(s) || progress
			}
			for j := range best[i].Decide {
				for _, simpler := range simplifications(best[i].Decide[j]) {
					s := cloneSteps(best)
					s[i].Decide[j] = simpler
					if try(s) {
						progress = true
						break
					}
				}
			}
		}
	}
	stopped()
	return res
}

// simplifications are r made simpler in one respect each: each one moves a
// field one way only (a cost towards zero, a limit down, a flag off), so
// that shrink, which takes any of them that still fails, cannot go back
// and forth between two failing requests until its deadline.
func simplifications(r backend.Request) []backend.Request {
	var out []backend.Request
	add := func(f func(*backend.Request)) {
		s := r
		f(&s)
		if s != r && s.Validate() == nil {
			out = append(out, s)
		}
	}
	add(func(s *backend.Request) { s.Force = false })
	add(func(s *backend.Request) { s.Shadow = false })
	add(func(s *backend.Request) { s.Burst = 0 })
	add(func(s *backend.Request) { s.Stamp = 0 })
	add(func(s *backend.Request) { s.Cost = 0 })
	if r.Cost > 1 || r.Cost < -1 {
		add(func(s *backend.Request) { s.Cost = 1 }) // not from 0: 0 is simpler still
	}
	add(func(s *backend.Request) { s.Cost /= 2 })
	add(func(s *backend.Request) { s.Limit = max(1, s.Limit/2) })
	add(func(s *backend.Request) { s.Limit = 1 })
	return out
}

func cloneSteps(steps []Step) []Step {
	s := slices.Clone(steps)
	for i := range s {
		s[i].Decide = slices.Clone(s[i].Decide)
		s[i].Reset = slices.Clone(s[i].Reset)
	}
	return s
}

// goTest prints steps as a test function calling Replay.
func (d Differential) goTest(steps []Step) string {
	paste := d.Paste
	if paste == "" {
		paste = "differential"
	}
	var b strings.Builder
	b.WriteString("func TestModelRegression(t *testing.T) {\n")
	fmt.Fprintf(&b, "\t%s.Replay(t, []backendtest.Step{\n", paste)
	for _, st := range steps {
		if st.Reset != nil {
			fmt.Fprintf(&b, "\t\t{At: %s, Reset: %#v},\n", goDuration(st.At), st.Reset)
			continue
		}
		fmt.Fprintf(&b, "\t\t{At: %s, Decide: %s},\n", goDuration(st.At), goRequests(st.Decide, "\t\t"))
	}
	b.WriteString("\t})\n}\n")
	return b.String()
}

// goRequests prints reqs as a Go slice literal; indent, when not empty,
// puts one request a line.
func goRequests(reqs []backend.Request, indent string) string {
	var b strings.Builder
	b.WriteString("[]backend.Request{")
	for i, r := range reqs {
		if indent != "" {
			b.WriteString("\n" + indent + "\t")
		} else if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "{Key: %q, Algorithm: backend.%s, Limit: %d, Period: %s", r.Key, algorithmName(r.Algorithm), r.Limit, goDuration(r.Period))
		if r.Burst != 0 {
			fmt.Fprintf(&b, ", Burst: %d", r.Burst)
		}
		fmt.Fprintf(&b, ", Cost: %d", r.Cost)
		if r.Lease != 0 {
			fmt.Fprintf(&b, ", Lease: %d", r.Lease)
		}
		if r.Stamp != 0 {
			fmt.Fprintf(&b, ", Stamp: %d", r.Stamp)
		}
		if r.Once != 0 {
			fmt.Fprintf(&b, ", Once: %d", r.Once)
		}
		if r.Force {
			b.WriteString(", Force: true")
		}
		if r.Shadow {
			b.WriteString(", Shadow: true")
		}
		b.WriteString("}")
		if indent != "" {
			b.WriteString(",")
		}
	}
	if indent != "" {
		b.WriteString("\n" + indent)
	}
	b.WriteString("}")
	return b.String()
}

// algorithmName is the Go name of an algorithm's constant.
func algorithmName(a backend.Algorithm) string {
	switch a {
	case backend.RollingWindow:
		return "RollingWindow"
	case backend.GCRA:
		return "GCRA"
	case backend.SlidingLog:
		return "SlidingLog"
	case backend.SlidingWindow:
		return "SlidingWindow"
	case backend.FixedWindow:
		return "FixedWindow"
	case backend.Concurrency:
		return "Concurrency"
	}
	return fmt.Sprintf("Algorithm(%d)", a)
}

// goDuration prints d as a readable Go constant expression.
func goDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "time.Hour"}, {time.Minute, "time.Minute"}, {time.Second, "time.Second"}, {time.Millisecond, "time.Millisecond"}, {time.Microsecond, "time.Microsecond"}} {
		if d%u.unit == 0 {
			return fmt.Sprintf("%d * %s", d/u.unit, u.name)
		}
	}
	return fmt.Sprintf("%d", int64(d))
}
