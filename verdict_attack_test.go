package ceiling

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// phasedBackend is a remote backend whose behaviour a test switches:
// frozen (decisions and probes answer nothing), or starved (decisions time
// out as they do on a process too busy to read their replies, while the
// probes answer, within the timeout but not at once: a healthy Redis
// behind a busy process), or healthy (everything answers).
type phasedBackend struct {
	frozen, starved atomic.Bool
}

func (p *phasedBackend) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	if p.frozen.Load() || (p.starved.Load() && !isProbe(reqs)) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if p.starved.Load() {
		time.Sleep(50 * time.Millisecond) // virtual
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (p *phasedBackend) Reset(context.Context, ...string) error { return nil }

// A failed probe's verdict is evidence about the backend at that moment.
// Redis froze for a moment (one request timed out, the probe failed, the
// breaker stayed closed: fewer than Failures timeouts) and came back; the
// instance then sat idle for an hour. A CPU flood on the healthy Redis
// that follows must be treated like one on an instance that never saw the
// freeze: FailOpen shed (503), not admitted unmetered, and no transition
// (TestTimeoutsOpenTheBreakerOnlyOnceAProbeConfirmsThem, frozen=false).
func TestStaleVerdictDoesNotFailOpenOnAHealthyRedis_Attack(t *testing.T) {
	for _, froze := range []bool{false, true} {
		t.Run(map[bool]string{false: "never-froze", true: "froze-an-hour-ago"}[froze], func(t *testing.T) { staleVerdict(t, froze) })
	}
}

func staleVerdict(t *testing.T, froze bool) {
	synctest.Test(t, func(t *testing.T) {
		be := &phasedBackend{}
		var mu sync.Mutex
		var transitions []DegradedEvent
		l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 100, Period: time.Minute, FailMode: FailOpen}},
			WithBackend(be), WithTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)),
			onDegraded(func(e DegradedEvent) { mu.Lock(); transitions = append(transitions, e); mu.Unlock() }))
		defer l.Close()
		h := l.Handler(okHandler)

		if froze {
			be.frozen.Store(true)
			if got := get(t, h).Code; got != 503 {
				t.Fatalf("a first timeout: %d, want 503 (shed, unconfirmed)", got)
			}
			time.Sleep(confirmBudget) // virtual: the probe fails, a verdict against the backend
			synctest.Wait()
			be.frozen.Store(false)
		}
		if hl := l.Health(); hl.Status != "healthy" {
			t.Fatalf("one timeout: %q, want healthy (breaker closed)", hl.Status)
		}

		time.Sleep(time.Hour) // virtual: idle; Redis is healthy all along
		be.starved.Store(true)
		var wg sync.WaitGroup
		codes := make([]int, 2*defaultBreakerFailures)
		for i := range codes {
			wg.Go(func() { codes[i] = get(t, h).Code })
		}
		wg.Wait()
		time.Sleep(confirmBudget) // virtual: the new probe answers
		synctest.Wait()
		hl := l.Health()
		mu.Lock()
		n := len(transitions)
		mu.Unlock()
		if hl.Rules[0].FailOpenAdmissions != 0 || n != 0 {
			t.Errorf("a CPU flood on a healthy Redis an hour after a one-off freeze: codes %v, %d admitted unmetered, %d transitions; want every request shed (503), 0 and 0",
				codes, hl.Rules[0].FailOpenAdmissions, n)
		}
	})
}
