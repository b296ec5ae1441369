package ceiling

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// Settlements whose replies are lost at random, on one key shared with
// another instance's traffic, are each applied exactly once: after the
// resends, the key counts exactly the units the requests used (every
// reservation settled to its actual, never refunded or charged twice).
func TestSettlementsUnderLostRepliesAppliedOnceRedis(t *testing.T) {
	for _, alg := range []backend.Algorithm{FixedWindow, RollingWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			rules := []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10000, Period: time.Hour, Algorithm: alg,
				Estimate: func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-Estimate"), 10, 64) }}}
			l, proxy, _ := proxiedLimiter(t, rules)
			rng := rand.New(rand.NewPCG(uint64(alg), 7))
			ctx := t.Context()
			var used int64
			for i := range 60 {
				est, actual := 1+rng.Int64N(10), rng.Int64N(16)
				lose := rng.IntN(3) == 0 && actual != est // a settlement to lose: one is sent
				h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if _, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 1}); err != nil { // another caller's unit
						t.Errorf("request %d: the other caller: %v", i, err)
					}
					if err := Settle(r, "tokens", actual); err != nil {
						t.Errorf("Settle: %v", err)
					}
					if lose {
						proxy.DropReply("fcall")
					}
				}))
				w := httptest.NewRecorder()
				r := httptest.NewRequest("POST", "/", nil)
				r.Header.Set("X-Shop", "acme")
				r.Header.Set("X-Estimate", strconv.FormatInt(est, 10))
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					t.Fatalf("request %d: status %d", i, w.Code)
				}
				used += actual + 1
			}
			if !eventually(func() bool { return l.pendingWrites() == 0 }) {
				t.Fatal("settlements still pending after 10 s")
			}
			p, err := l.Peek(ctx, "tokens", "acme")
			if err != nil || p.Remaining != 10000-used {
				t.Errorf("after %d lost replies: %+v, %v; want %d left (%d used)", proxy.Dropped(), p, err, 10000-used, used)
			}
			if h := l.Health(); h.DroppedWrites != 0 {
				t.Errorf("DroppedWrites %d", h.DroppedWrites)
			}
		})
	}
}
