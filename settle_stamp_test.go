package ceiling

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// A settlement gives back the units its reservation took, never another
// request's: the LLM pattern of reserving max_tokens and using few. A
// reserves 5 (Estimate) and blocks; B takes 5; A settles 0, a refund of 5;
// then C takes 5 and D asks for 5 until it is admitted. Counting the units
// really used (A's 0, B's, C's and D's), no window ever holds more than the
// limit of 10. A refund of the newest units gave B's back instead of A's,
// and D's 5 fit beside B's and C's: 15 real units in one window.
func TestSettlementRefundsItsOwnUnits_StampRegression(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name        string
		alg         backend.Algorithm
		period      time.Duration
		a           time.Duration   // A's reservation
		b           []time.Duration // B's units, one each
		settle, d   time.Duration   // A's settlement and C's request; D's first try
		alignedOnly bool            // FixedWindow promises only its aligned windows
	}{
		{"sliding log 10 per 3 s", SlidingLog, 3 * s, 0, steps(200*time.Millisecond, 50*time.Millisecond, 5), 2500 * time.Millisecond, 3200 * time.Millisecond, false},
		{"sliding log 10 per 60 s", SlidingLog, 60 * s, 0, steps(4*s, s, 5), 50 * s, 64 * s, false},
		{"rolling window 10 per 60 s", RollingWindow, 60 * s, 0, steps(4*s, s, 5), 50 * s, 64 * s, false},
		{"fixed window 10 per 60 s", FixedWindow, 60 * s, 59 * s, steps(60*s, 200*time.Millisecond, 5), 62 * s, 64 * s, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1_699_999_980, 0) // aligned to every period here
			clock := &fakeClock{t: start}
			store := memory.New(memory.WithClock(clock.Now))
			defer store.Close()
			l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10, Period: tc.period, Algorithm: tc.alg,
				Estimate: func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64) },
			}}, WithBackend(store), withClock(clock.Now))
			defer l.Close()
			hold := make(chan struct{})
			entered := make(chan struct{}, 1)
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				used, _ := strconv.ParseInt(r.Header.Get("X-Used"), 10, 64)
				if err := Settle(r, "tokens", used); err != nil {
					t.Errorf("Settle: %v", err)
				}
				if r.Header.Get("X-Hold") != "" {
					entered <- struct{}{}
					<-hold
				}
			}))
			req := func(estimate, used int, held bool) *http.Request {
				r := httptest.NewRequest("POST", "/", nil)
				r.Header.Set("X-Shop", "acme")
				r.Header.Set("X-Estimate", strconv.Itoa(estimate))
				r.Header.Set("X-Used", strconv.Itoa(used))
				if held {
					r.Header.Set("X-Hold", "1")
				}
				return r
			}
			at := func(d time.Duration) { clock.mu.Lock(); clock.t = start.Add(d); clock.mu.Unlock() }
			var used []use // the units really used, and when

			at(tc.a)
			var wg sync.WaitGroup
			wg.Add(1)
			var codeA int
			go func() {
				defer wg.Done()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req(5, 0, true))
				codeA = w.Code
			}()
			<-entered
			for _, tb := range tc.b {
				at(tb)
				if w := serve(t, h, req(1, 1, false)); w.Code != 200 {
					t.Fatalf("B at %v: %d, want 200", tb, w.Code)
				}
				used = append(used, use{tb, 1})
			}
			at(tc.settle)
			close(hold)
			wg.Wait()
			if codeA != 200 {
				t.Fatalf("A: %d, want 200", codeA)
			}
			if w := serve(t, h, req(5, 5, false)); w.Code != 200 {
				t.Fatalf("C at %v, after A gave its 5 back: %d, want 200", tc.settle, w.Code)
			}
			used = append(used, use{tc.settle, 5})
			step := tc.period / 60
			for i := 0; ; i++ {
				when := tc.d + time.Duration(i)*step
				at(when)
				if w := serve(t, h, req(5, 5, false)); w.Code == 200 {
					used = append(used, use{when, 5})
					break
				}
				if i == 120 {
					t.Fatalf("D never admitted up to %v", when)
				}
			}
			if n, when := mostInAWindow(used, tc.period, tc.alignedOnly); n > 10 {
				t.Errorf("%d units really used in the window ending at %v, want at most 10 (uses %v)", n, when, used)
			}
		})
	}
}

// steps is n instants from first, every gap.
func steps(first, gap time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = first + time.Duration(i)*gap
	}
	return out
}

type use struct {
	at    time.Duration
	units int
}

// mostInAWindow is the most units used in one window of period: any
// rolling window (each ending at a use), or only the aligned ones.
func mostInAWindow(uses []use, period time.Duration, aligned bool) (int, time.Duration) {
	most, end := 0, time.Duration(0)
	for _, u := range uses {
		n := 0
		for _, v := range uses {
			in := v.at <= u.at && v.at > u.at-period
			if aligned {
				in = v.at/period == u.at/period
			}
			if in {
				n += v.units
			}
		}
		if n > most {
			most, end = n, u.at
		}
	}
	return most, end
}
