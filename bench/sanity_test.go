package bench

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// These tests run under plain `go test` (CI, with -race): they prove every
// adapter measures a limiter that enforces its limit, so that no benchmark
// times a limiter that admits everything.

func TestMemoryLimitersEnforceTheirLimit(t *testing.T) {
	ks := keys(1000)
	for _, lib := range memLibs {
		t.Run(lib.name, func(t *testing.T) { checkMem(t, lib, ks) })
	}
}

func TestMiddlewaresEnforceTheirLimitPerClient(t *testing.T) {
	addrs := addrs(1000)
	for _, lib := range httpLibs {
		t.Run(lib.name, func(t *testing.T) { checkHTTP(t, lib, addrs) })
	}
}

func TestMiddlewareBasesAdmitEverything(t *testing.T) {
	for _, lib := range httpBases {
		h := lib.new(enforceLimit, 0)
		for i := range enforceTries {
			if code := serve(h, "10.0.0.1:1234"); code != 200 {
				t.Fatalf("%s: request %d: status %d, want 200 from a handler with no limiter", lib.name, i, code)
			}
		}
	}
}

func TestRedisLimitersEnforceEveryRule(t *testing.T) {
	addr := redisAddr(t)
	for _, lib := range redisLibs {
		for _, n := range []int{1, 3} {
			t.Run(lib.name+"/rules="+itoa(n), func(t *testing.T) { checkRedis(t, lib, addr, n, 200) })
		}
	}
}

// TestCeilingIsExactAcrossInstances is the exactness row's claim for
// ceiling: 1000 concurrent decisions from 4 instances on one key under 100
// per minute admit exactly 100, whatever the algorithm. (GCRA refills one
// unit every 600ms; the experiment takes far less, and the test says so if
// not.)
func TestCeilingIsExactAcrossInstances(t *testing.T) {
	addr := redisAddr(t)
	for _, algo := range backend.Algorithms() {
		t.Run(algo.String(), func(t *testing.T) {
			lib := redisLib{name: "ceiling-" + algo.String(), new: ceilingRedis(algo)}
			out := runExact(t, lib, addr)
			if out.errors != 0 {
				t.Fatalf("%d decisions failed", out.errors)
			}
			if algo == backend.GCRA && out.elapsed >= 600*time.Millisecond {
				t.Skipf("took %v: GCRA refilled a unit meanwhile; admitted %d", out.elapsed, out.admitted)
			}
			if got, want := out.admitted, exactLimit; got != want {
				t.Fatalf("admitted %d of %d against a limit of %d", got, exactCalls, want)
			}
			if got, want := out.rejected, exactCalls-exactLimit; got != want {
				t.Fatalf("rejected %d, want %d", got, want)
			}
		})
	}
}
