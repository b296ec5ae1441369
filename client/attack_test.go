package client

import (
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
)

// ruled is ceiling's middleware with rules for everybody over a handler
// that answers 200, on the default memory store.
func ruled(t *testing.T, rules ...ceiling.Rule) *server {
	t.Helper()
	for i := range rules {
		rules[i].Key = ceiling.Static("all")
	}
	l, err := ceiling.New(rules, ceiling.WithKeySecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &server{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
}

// A lone sequential client that waits as ceiling says is never refused
// twice in a row (without Pace: every retry after the wait is admitted),
// and with Pace is never refused at all, whatever the algorithm and
// whether the period is a whole number of seconds.
func TestTransportWaitMatchesCeiling_Attack(t *testing.T) {
	algs := []backend.Algorithm{ceiling.RollingWindow, ceiling.SlidingLog, ceiling.SlidingWindow, ceiling.FixedWindow, ceiling.GCRA}
	periods := []time.Duration{100 * time.Millisecond, 1500 * time.Millisecond, 10 * time.Second, 61 * time.Second}
	for _, alg := range algs {
		for _, p := range periods {
			for _, pace := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%v/pace=%v", alg, p, pace), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						srv := ruled(t, ceiling.Rule{Name: "api", Limit: 3, Period: p, Algorithm: alg})
						tr := &Transport{Base: srv, Pace: pace, MaxWait: time.Hour}
						for i := range 20 {
							resp, _ := send(t, t.Context(), tr, "GET", nil)
							if resp.StatusCode != 200 {
								t.Fatalf("GET %d: %d (%v %v) after the server's waits: %v", i, resp.StatusCode, resp.Header.Values("Retry-After"), resp.Header.Values("Ratelimit"), srv.seen())
							}
						}
						seen := srv.seen()
						for i := 1; i < len(seen); i++ {
							if seen[i] == 429 && seen[i-1] == 429 {
								t.Errorf("refused again after waiting what the server said: %v", seen)
								break
							}
						}
						if pace && srv.rejected() > 0 {
							t.Errorf("Pace: %d refusals: %v", srv.rejected(), seen)
						}
					})
				})
			}
		}
	}
}

// Two rules and a cost: the waits ceiling sends still get a lone client
// through with no refusal twice in a row, and none under Pace.
func TestTransportWaitMatchesCeilingTwoRules_Attack(t *testing.T) {
	algs := []backend.Algorithm{ceiling.RollingWindow, ceiling.SlidingLog, ceiling.SlidingWindow, ceiling.FixedWindow, ceiling.GCRA}
	for _, alg := range algs {
		for _, pace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/pace=%v", alg, pace), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := ruled(t,
						ceiling.Rule{Name: "burst", Limit: 2, Period: 1500 * time.Millisecond, Algorithm: alg},
						ceiling.Rule{Name: "hour", Limit: 7, Period: 20 * time.Second, Algorithm: alg},
					)
					tr := &Transport{Base: srv, Pace: pace, MaxWait: time.Hour}
					for i := range 30 {
						resp, _ := send(t, t.Context(), tr, "GET", nil)
						if resp.StatusCode != 200 {
							t.Fatalf("GET %d: %d (%v %v): %v", i, resp.StatusCode, resp.Header.Values("Retry-After"), resp.Header.Values("Ratelimit"), srv.seen())
						}
					}
					seen := srv.seen()
					for i := 1; i < len(seen); i++ {
						if seen[i] == 429 && seen[i-1] == 429 {
							t.Errorf("refused again after waiting what the server said: %v", seen)
							break
						}
					}
					if pace && srv.rejected() > 0 {
						t.Errorf("Pace: %d refusals: %v", srv.rejected(), seen)
					}
				})
			})
		}
	}
}
