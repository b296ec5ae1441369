package bench

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fatalTB records the first Fatalf of a check and stops it there, so that
// the checks themselves can be tested; everything else goes to the real
// test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs check on a fatalTB in a goroutine of its own and returns its
// Fatalf message, or "" if it passed.
func failure(t *testing.T, check func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(tb)
	}()
	<-done
	return tb.msg
}

// admitsAll is a broken adapter: it admits every request.
var admitsAll = memLib{name: "admits-all", new: func(int, time.Duration, time.Duration) memLimiter {
	return memLimiter{worker: same(func(string) (bool, error) { return true, nil }), close: noClose}
}}

// oneKey is a broken adapter: it keeps a limit per limiter, whatever the key.
var oneKey = memLib{name: "one-key", new: func(limit int, period, idle time.Duration) memLimiter {
	m := newRateMap(limit, period)
	return memLimiter{worker: same(func(string) (bool, error) { return m.allow("same"), nil }), close: noClose}
}}

func TestCheckMemFailsAnAdapterThatAdmits15Of15(t *testing.T) {
	msg := failure(t, func(tb testing.TB) { checkMem(tb, admitsAll, nil) })
	if want := "admitted 15 of 15"; !strings.Contains(msg, want) {
		t.Fatalf("checkMem said %q, want a failure saying %q", msg, want)
	}
}

func TestCheckMemFailsAnAdapterWhoseKeysAreNotDistinct(t *testing.T) {
	msg := failure(t, func(tb testing.TB) { checkMem(tb, oneKey, keys(100)) })
	if want := "keys are not distinct"; !strings.Contains(msg, want) {
		t.Fatalf("checkMem said %q, want a failure saying %q", msg, want)
	}
}

func TestCheckHTTPFailsAMiddlewareThatNeverRejects(t *testing.T) {
	lib := httpLib{name: "no-limit", base: "bare", new: func(int, time.Duration) http.Handler { return bare }}
	msg := failure(t, func(tb testing.TB) { checkHTTP(tb, lib, nil) })
	if want := "statuses [200 200 200 200 200 200 200 200 200 200 200 200 200 200 200]"; !strings.Contains(msg, want) {
		t.Fatalf("checkHTTP said %q, want a failure saying %q", msg, want)
	}
}

func TestCheckRedisFailsALimiterThatChecksOnlyItsFirstRule(t *testing.T) {
	addr := redisAddr(t)
	firstOnly := redisLib{name: "first-rule-only", new: func(tb testing.TB, c *redis.Client, prefix string, rules []rule) func() redisDecider {
		return redisLibs[0].new(tb, c, prefix, rules[:1])
	}}
	msg := failure(t, func(tb testing.TB) { checkRedis(tb, firstOnly, addr, 3, 10) })
	if want := "admitted 15 of 15"; !strings.Contains(msg, want) {
		t.Fatalf("checkRedis said %q, want a failure saying %q", msg, want)
	}
}
