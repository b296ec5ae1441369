package ceiling

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A key's stored state is meant to stay small and bounded whatever the
// traffic (DESIGN.md: "small bounded state per key"), but every settlement
// to a remote backend leaves a record beside its key for twice the rule's
// Period, whether or not its reply was ever lost. A refund gives its units
// back, so the rule does not bound how many settlements one key makes: a
// client whose requests each reserve and then settle 0 (a handler that
// settles what it used, nothing, on a bad input or a client gone) is
// admitted without end and leaves one Redis key per request for 48 hours
// on a daily rule. Here one shop of limit 3 per day makes 200 requests,
// all admitted, and leaves 200 records that each live two days.
func TestSettlementRecordsBoundedPerKey_Attack(t *testing.T) {
	t.Skip("defect: a settlement's #o record lives 2×Period per settlement; refunds make their number per key unbounded by the limit")
	l, _, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 3, Period: 24 * time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 3, nil }}})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
	}))
	const n = 200
	admitted := 0
	for range n {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", "acme")
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	keys, err := direct.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	var ttl time.Duration
	for _, k := range keys {
		if strings.Contains(k, "#o") {
			records++
			ttl = direct.PTTL(t.Context(), k).Val()
		}
	}
	t.Logf("%d of %d admitted; %d keys in Redis, %d of them settlement records (one's TTL %v)", admitted, n, len(keys), records, ttl)
	if admitted != n {
		t.Fatalf("%d of %d admitted; each settled 0 and should have left the budget whole", admitted, n)
	}
	if records > 2*3 {
		t.Errorf("one key of limit 3 holds %d settlement records, living %v each: its stored state grows with its traffic, not its limit", records, ttl)
	}
}
