package main

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A misconfigured Redis refuses the start within seconds, naming the
// cause; so does an unreachable one, since the OTP rules fail closed and
// would answer only 503s (issue 12.8).
func TestBinaryRefusesAMisconfiguredOrUnreachableRedis(t *testing.T) {
	bin := otpBinary.Path(t)
	cases := servicetest.Misconfigurations(t)
	down := redistest.Server(t)
	down.Kill()
	cases = append(cases, servicetest.Misconfigured{Name: "unreachable", RedisURL: "redis://" + down.Addr + "/0", Cause: []string{"refused"}})
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			start := time.Now()
			log, code := servicetest.Exit(t, bin, []string{"REDIS_URL=" + c.RedisURL}, 15*time.Second)
			if code <= 0 || !servicetest.ContainsAny(log, c.Cause) {
				t.Errorf("exit code %d after %v, want non-zero with a message naming %v:\n%s", code, time.Since(start), c.Cause, log)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("refused after %v, want within seconds", took)
			}
		})
	}
}
