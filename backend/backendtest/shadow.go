package backendtest

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testShadow pins Request.Shadow: a shadow request is evaluated and
// reported, its rejection blocks nothing, and it consumes only when it fits
// and the call is admitted.
func (s *suite) testShadow(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		enforced := req(e.key("enforced"), alg, 10, time.Minute, 1)
		shadow := req(e.key("shadow"), alg, 2, time.Minute, 1)
		shadow.Shadow = true

		// The shadow rule fits twice, then reports rejections that refuse
		// nothing: the enforced rule keeps admitting and counting.
		for i, wantShadow := range []bool{true, true, false, false} {
			got := e.decide(enforced, shadow)
			if !got[0].Allowed {
				t.Fatalf("call %d: the enforced rule was refused: %+v", i, got)
			}
			if got[1].Allowed != wantShadow {
				t.Errorf("call %d: shadow allowed = %v, want %v", i, got[1].Allowed, wantShadow)
			}
			if !wantShadow && got[1].RetryAfter <= 0 {
				t.Errorf("call %d: a shadow rejection reports no retry-after: %+v", i, got[1])
			}
		}
		if got, want := e.remaining(enforced), int64(6); got != want {
			t.Errorf("enforced remaining = %d, want %d: every call was admitted", got, want)
		}
		if got, want := e.remaining(shadow), int64(0); got != want {
			t.Errorf("shadow remaining = %d, want %d", got, want)
		}

		// When an enforced rule rejects, a fitting shadow request consumes
		// nothing either.
		fresh := req(e.key("fresh-shadow"), alg, 5, time.Minute, 1)
		fresh.Shadow = true
		full := req(e.key("full"), alg, 1, time.Minute, 1)
		e.one(full)
		got := e.decide(fresh, full)
		if !got[0].Allowed || got[1].Allowed {
			t.Fatalf("fitting shadow with a rejecting rule: %+v", got)
		}
		if got, want := e.remaining(fresh), int64(5); got != want {
			t.Errorf("shadow remaining after a rejected call = %d, want %d", got, want)
		}
	})
}
