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

// A request that can never fit one rule, while another rule is spent, is
// not retried on the spent rule's wait: ceiling names no wait for it.
func TestTransportNeverFitsBesideASpentRule_Attack(t *testing.T) {
	algs := []backend.Algorithm{ceiling.RollingWindow, ceiling.SlidingLog, ceiling.SlidingWindow, ceiling.FixedWindow, ceiling.GCRA}
	for _, alg := range algs {
		t.Run(fmt.Sprint(alg), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				big := func(r *http.Request) (string, error) {
					if r.Header.Get("X-Big") == "" {
						return "", ceiling.ErrNoKey
					}
					return "all", nil
				}
				l, err := ceiling.New([]ceiling.Rule{
					{Name: "big", Key: big, Limit: 5, Period: 10 * time.Second, Algorithm: alg, Estimate: func(*http.Request) (int64, error) { return 10, nil }},
					{Name: "small", Key: ceiling.Static("all"), Limit: 1, Period: 10 * time.Second, Algorithm: alg},
				}, ceiling.WithKeySecret(secret))
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				srv := &server{h: l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
				tr := &Transport{Base: srv, Pace: false}
				send(t, t.Context(), tr, "GET", nil)
				req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
				req.Header.Set("X-Big", "1")
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); resp.StatusCode != 429 || took != 0 {
					t.Errorf("status %d after %v, want the 429 at once", resp.StatusCode, took)
				}
				checkSeen(t, srv, 200, 429)
			})
		})
	}
}

// GCRA with a burst smaller than its limit, at emission intervals that
// are no whole number of seconds: ceiling's waits still get a lone client
// through, refused at most once per request and never under Pace.
func TestTransportWaitMatchesCeilingGCRABurst_Attack(t *testing.T) {
	for _, burst := range []int64{1, 2} {
		for _, pace := range []bool{false, true} {
			t.Run(fmt.Sprintf("burst=%d/pace=%v", burst, pace), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := ruled(t, ceiling.Rule{Name: "api", Limit: 7, Burst: burst, Period: 10 * time.Second, Algorithm: ceiling.GCRA})
					tr := &Transport{Base: srv, Pace: pace}
					for i := range 20 {
						resp, _ := send(t, t.Context(), tr, "GET", nil)
						if resp.StatusCode != 200 {
							t.Fatalf("GET %d: %d: %v", i, resp.StatusCode, srv.seen())
						}
					}
					seen := srv.seen()
					for i := 1; i < len(seen); i++ {
						if seen[i] == 429 && seen[i-1] == 429 {
							t.Errorf("refused again after the server's wait: %v", seen)
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
