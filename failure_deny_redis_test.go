package ceiling

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A key Redis rejected until T stays rejected until T while Redis is down,
// from the deny cache, whatever the fail mode: a 429 with its Retry-After,
// not a fail-mode admission (the cache lives in the Redis store, and before
// this the limiter applied the fail mode without asking it, so FailOpen
// admitted the spent key at once). Fresh keys follow the fail mode, the
// limiter is degraded, and once T has passed the spent key follows the
// fail mode too.
func TestSpentKeyStaysRefusedWhileRedisIsDown(t *testing.T) {
	// How fast a frozen Redis is blamed depends on this process having a
	// CPU: a starved one waits up to 2 s for a reply (backend/redis).
	citest.Only(t)
	for _, mode := range []FailMode{FailOpen, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			inst := redistest.Server(t)
			l := MustNew([]Rule{{Name: "shop", Key: RemoteAddr, Limit: 2, Period: 2 * time.Second}},
				WithBackend(redisStore(t, inst)), WithFailMode(mode), WithLogger(slog.New(slog.DiscardHandler)))
			defer l.Close()
			ctx := context.Background()
			decide := func(key string) RuleResult {
				t.Helper()
				d, err := l.Decide(ctx, Input{Rule: "shop", Key: key})
				if err != nil {
					t.Fatalf("Decide(%q): %v", key, err)
				}
				return d.Results[0]
			}
			const spent = "198.51.100.7" // what RemoteAddr returns for it
			for range 2 {
				decide(spent)
			}
			refused := time.Now()
			first := decide(spent)
			if first.Allowed || first.Fallback != inherit {
				t.Fatalf("third of 2 with Redis up: %+v, want refused by Redis", first)
			}
			until := refused.Add(first.RetryAfter)

			inst.Kill()
			fresh := 0
			for l.Health().Status == "healthy" {
				if fresh++; fresh > 100 {
					t.Fatal("still healthy after 100 decisions on a killed Redis")
				}
				decide("fresh-" + itoa(fresh))
			}
			h := l.Handler(okHandler)
			checked := 0
			for time.Until(until) > 200*time.Millisecond {
				rr := decide(spent)
				if time.Until(until) <= 0 {
					break // the decision straddled T
				}
				if rr.Allowed || rr.Fallback != inherit || !rr.Cached || rr.RetryAfter <= 0 {
					t.Fatalf("the spent key %v before its RetryAfter, Redis down: %+v, want refused from the deny cache", time.Until(until), rr)
				}
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = spent + ":1"
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != 429 || w.Header().Get("Retry-After") == "" {
					t.Fatalf("the spent key over HTTP: %d, Retry-After %q; want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
				}
				if rr := decide("fresh-" + itoa(fresh+checked)); !rr.Allowed || rr.Fallback != mode {
					t.Fatalf("a fresh key, Redis down: %+v, want admitted failing %v", rr, mode)
				}
				checked++
				time.Sleep(20 * time.Millisecond) // a client's pace while redis-server is down
			}
			if checked == 0 {
				t.Fatal("the breaker took the whole RetryAfter to open; nothing checked")
			}
			time.Sleep(time.Until(until) + 50*time.Millisecond) // past the RetryAfter redis-server gave, on the real clock
			if rr := decide(spent); rr.Fallback != mode || rr.Cached {
				t.Errorf("the spent key after its RetryAfter, Redis down: %+v, want decided failing %v", rr, mode)
			}
			hl := l.Health()
			if hl.Status != "degraded" || hl.DegradedTotal != 1 {
				t.Errorf("health %+v, want degraded once", hl)
			}
			admitted := hl.Rules[0].FailOpenAdmissions + hl.Rules[0].FailLocalAdmissions
			if admitted < int64(checked) {
				t.Errorf("%d fail-mode admissions for %d fresh keys checked", admitted, checked)
			}
			t.Logf("%d times refused from the deny cache while degraded; %d fail-mode admissions", checked, admitted)
		})
	}
}
