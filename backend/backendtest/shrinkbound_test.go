package backendtest

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// planted is the memory store with a planted defect, its Reset forgetting
// nothing, and, when set, a delay on every Decide, or a Decide of a
// zero-cost request (a peek) that never returns, whatever its context
// says, until the test ends: miniredis running a script in an endless
// loop does that, and holds its lock meanwhile.
type planted struct {
	*memory.Store
	delay time.Duration
	hang  chan struct{} // closed when the test ends
}

func (planted) Reset(context.Context, ...string) error { return nil }

func (p planted) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	time.Sleep(p.delay)
	if p.hang != nil {
		for _, r := range reqs {
			if r.Cost == 0 {
				<-p.hang
			}
		}
	}
	return p.Store.Decide(ctx, reqs)
}

// plantedDifferential is the differential test of p; its first sequence
// (seed 9) finds the forgetful Reset.
func plantedDifferential(p planted) Differential {
	return Differential{
		Seed: 9,
		New: func(t testing.TB, now func() time.Time) Target {
			p := p
			p.Store = memory.New(memory.WithClock(now), memory.WithSweepInterval(0))
			return Target{Backend: p}
		},
	}
}

// runWithin runs d's sequences like Run and returns its failure message,
// failing the test if that takes longer than bound (it then gives up
// waiting, leaving the run behind).
func runWithin(t *testing.T, d Differential, shrinkFor, bound time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	done := make(chan string, 1)
	go func() { done <- d.run(t, 1, d.Seed, shrinkFor, time.Time{}) }()
	select {
	case msg := <-done:
		if msg == "" {
			t.Fatal("the planted defect was not found")
		}
		return msg, time.Since(start)
	case <-time.After(bound):
		t.Fatalf("Run on a broken backend still running after %v", bound)
		return "", 0
	}
}

// TestShrinkCutShortSaysSo: a failure whose shrinking outlives its
// deadline (a slow backend: a replay takes about 0.3s, and shrinking this
// one completely takes over 50) stops at the deadline and says the case
// it prints may not be minimal, with the step counts and replays so far.
func TestShrinkCutShortSaysSo(t *testing.T) {
	const shrinkFor = 300 * time.Millisecond
	d := plantedDifferential(planted{delay: 10 * time.Millisecond})
	msg, took := runWithin(t, d, shrinkFor, 10*time.Second)
	m := regexp.MustCompile(`Shrunk from (\d+) to (\d+) steps in (\d+) replays, then cut short by the 300ms shrink deadline \([^)]*\): it may not be minimal\. It fails with:\n`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no cut-short summary naming the deadline in:\n%s", msg)
	}
	if !strings.Contains(msg, "Paste it as a regression test:\n\nfunc TestModelRegression(") {
		t.Errorf("the case found so far is not printed:\n%s", msg)
	}
	t.Logf("ended %v after it started (shrinking for at most %v):\n%s", took, shrinkFor, m[0])
}

// TestHangingBackendFailsWithinItsBound is a backend that never answers
// one call (a script in an endless loop): the step fails once the call
// timeout passes, and the sequence up to it is printed unshrunk (replays
// on a backend that may stay hung prove nothing), where the run used to
// wait for the call until go test's -timeout.
func TestHangingBackendFailsWithinItsBound(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	d := plantedDifferential(planted{hang: hang})
	d.CallTimeout = 200 * time.Millisecond
	msg, took := runWithin(t, d, time.Minute, 10*time.Second)
	m := regexp.MustCompile(`(?s)step (\d+): Decide\(.*\) did not return within 200ms \(abandoned after [^)]*\)\n.*` +
		`Not shrunk: step (\d+) hung or timed out, and a backend that hung may stay hung [^\n]*, so replays would prove nothing\. ` +
		`The sequence up to it, (\d+) of (\d+) steps, fails with:\n`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no hang report in:\n%s", msg)
	}
	if m[1] != m[2] {
		t.Errorf("the hang is at step %s, the report says %s", m[1], m[2])
	}
	pasted := strings.Count(msg[strings.Index(msg, "func TestModelRegression("):], "{At: ")
	if want, _ := strconv.Atoi(m[3]); want == 0 || pasted != want {
		t.Errorf("%d steps printed, want the %s up to the step that hung:\n%s", pasted, m[3], msg)
	}
	t.Logf("ended %v after it started", took)
}

// TestShrinkBudgetBoundsTheProcess: the shrinking of all Runs of a process
// takes at most twice the per-failure deadline, and stops well before the
// test binary's -timeout, each saying which bound cut it.
func TestShrinkBudgetBoundsTheProcess(t *testing.T) {
	var b budget
	now := time.Now()
	end, why := b.take(time.Minute, time.Time{})
	if got := end.Sub(now); got < time.Minute || got > time.Minute+time.Second || why != "the 1m0s shrink deadline" {
		t.Errorf("a first shrink: %v, %q; want a minute, the shrink deadline", got, why)
	}
	b.spent(90 * time.Second)
	end, why = b.take(time.Minute, time.Time{})
	if got := time.Until(end); got > 31*time.Second || got < 29*time.Second || !strings.Contains(why, "this process's 2m0s budget") {
		t.Errorf("after 90s spent: %v, %q; want the 30s left of the process's 2m0s", got, why)
	}
	b.spent(time.Minute)
	if end, _ = b.take(time.Minute, time.Time{}); time.Until(end) > 0 {
		t.Errorf("after the budget is spent, a shrink may still run until %v", end)
	}
	end, why = (&budget{}).take(time.Minute, time.Now().Add(50*time.Second))
	if got := time.Until(end); got > 46*time.Second || got < 44*time.Second || why != "the test binary's -timeout" {
		t.Errorf("50s before -timeout: %v, %q; want 45s, cut by the -timeout", got, why)
	}
}
