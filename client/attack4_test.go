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
