package ceiling_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// An Estimate that returns ErrNoKey (the request names no cost, as a
// header key function answers for a missing header) estimates one unit,
// the default cost, and the request is decided under the rule: the rule is
// left out only by its Key. A client that sent no X-Cost got 30 of 30
// requests on a budget of 10. The reservation is there to settle.
func TestEstimateErrNoKeyIsTheDefaultCostRegression(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "tokens", Limit: 10, Period: time.Minute, Algorithm: ceiling.SlidingLog,
		Key: ceiling.Header("X-Api-Key"),
		Estimate: func(r *http.Request) (int64, error) {
			v, err := ceiling.Header("X-Cost")(r)
			if err != nil {
				return 0, err // ErrNoKey: the request names no cost
			}
			return strconv.ParseInt(v, 10, 64)
		}}})
	defer l.Close()
	var settled []error
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		settled = append(settled, ceiling.Settle(r, "tokens", 1))
	}))
	var codes []int
	for range 12 {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("X-Api-Key", "eve")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	want := []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429}
	if !slices.Equal(codes, want) {
		t.Errorf("12 requests without X-Cost on a budget of 10: %v, want %v", codes, want)
	}
	for i, err := range settled {
		if err != nil {
			t.Errorf("request %d: Settle: %v, want its one-unit reservation", i, err)
		}
	}
	if _, err := ceiling.Header("X-Cost")(httptest.NewRequest(http.MethodGet, "/", nil)); !errors.Is(err, ceiling.ErrNoKey) {
		t.Fatalf("a missing header: %v, want ErrNoKey (the case under test)", err)
	}
}
