package ceiling_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// The RateLimit values of many responses share blocks of memory: each must
// stay what it was when its response was written, whatever the requests
// after it do, and a handler that appends to its header must not reach
// another response's value.
func TestRateLimitValuesOutliveLaterResponses(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1000, Period: time.Hour}})
	defer l.Close()
	h := l.Handler(bare)
	type kept struct {
		held []string // the header map's slice, as the response keeps it
		was  string   // a copy of its value when the response was written
	}
	var all []kept
	for i := range 300 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "203.0.113.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		v := w.Header()["Ratelimit"]
		if len(v) != 1 || !strings.HasPrefix(v[0], `"ip";r=`) {
			t.Fatalf("request %d: RateLimit %q", i, v)
		}
		all = append(all, kept{v, strings.Clone(v[0])})
	}
	for _, k := range all {
		_ = append(k.held, "appended by a handler") // capacity 1: a copy, never the next value
	}
	for i, k := range all {
		if len(k.held) != 1 || k.held[0] != k.was {
			t.Fatalf("response %d: RateLimit became %q, was %q", i, k.held, k.was)
		}
	}
	if all[0].was == all[len(all)-1].was {
		t.Fatalf("every response says %q: the test did not see the budget change", all[0].was)
	}
}
