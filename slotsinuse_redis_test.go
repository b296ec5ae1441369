package ceiling

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// On Redis, a slot held on the backend and one FailLocal took during an
// outage both count, and the recovery that moves the local one to the
// backend does not count it twice; their releases bring the count to 0.
func TestHealthCountsSlotsAcrossARedisOutage(t *testing.T) {
	inst := redistest.Server(t)
	p := redistest.NewProxy(t, inst.Addr)
	rule := Rule{Name: "streams", Limit: 4, Period: 30 * time.Second, Algorithm: Concurrency}
	l := slotsLimiter(t, p.Addr, redistest.KeyPrefix(t), rule, WithTimeout(time.Second),
		WithBreaker(BreakerConfig{CoolDown: 50 * time.Millisecond, MaxCoolDown: time.Second}))
	ctx := t.Context()
	in := Input{Rule: "streams", Key: "acme"}
	remote, err := l.Decide(ctx, in)
	if err != nil || !remote.Allowed || remote.Results[0].Fallback != inherit {
		t.Fatalf("healthy: allowed %v by %v (%v), want admitted by Redis", remote.Allowed, remote.Results[0].Fallback, err)
	}
	defer remote.Release()
	p.Partition()
	p.Cut()
	untilDegraded(t, l)
	local, err := l.Decide(ctx, in)
	if err != nil || !local.Allowed || local.Results[0].Fallback != FailLocal {
		t.Fatalf("degraded: allowed %v by %v (%v), want admitted locally", local.Allowed, local.Results[0].Fallback, err)
	}
	defer local.Release()
	if got := slotsInUse(l)["streams"]; got != 2 {
		t.Fatalf("one slot on Redis, one local: slots in use %d, want 2", got)
	}
	p.Heal()
	if !eventually(func() bool { return l.Health().Status == "healthy" }) {
		t.Fatal("never recovered")
	}
	if got := slotsInUse(l)["streams"]; got != 2 {
		t.Fatalf("after the recovery moved the local slot: slots in use %d, want 2", got)
	}
	remote.Release()
	local.Release()
	if got := slotsInUse(l)["streams"]; got != 0 {
		t.Fatalf("after both releases: slots in use %d, want 0", got)
	}
}
