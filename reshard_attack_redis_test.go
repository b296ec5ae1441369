package ceiling

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReshardingOneSlotDegradesEveryKey_Attack: an operator reshards a
// Redis Cluster (redis-cli --cluster reshard moves a slot's keys a batch
// at a time). While the slot of one busy caller is half moved (here for
// 300 ms), the node answers its decisions (one multi-key script: every
// rule of a value shares the value's hash tag) TRYAGAIN. The Store failed
// them at once, the limiter counted each as a backend failure, and five of
// them in a row opened the breaker: every other caller, on healthy slots,
// was then decided by the fail mode too (here FailClosed: 503 for
// everybody), for at least the breaker's cool-down, though nothing was
// ever unreachable. The Store now sends a TRYAGAIN'd script again within
// its budget, and the busy caller is decided once the move completes.
func TestReshardingOneSlotDegradesEveryKey_Attack(t *testing.T) {
	c := redistest.Cluster(t)
	client := c.Client(t)
	ctx := context.Background()
	rules := []Rule{
		{Name: "minute", Key: Header("X-Shop"), Limit: 100, Period: time.Minute},
		{Name: "day", Key: Header("X-Shop"), Limit: 1000, Period: 24 * time.Hour},
	}
	l := MustNew(rules, WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix("p"), ceilingredis.WithDenyCache(0))),
		WithFailMode(FailClosed), WithTimeout(time.Second), WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	decide := func(shop string) (Decision, error) {
		return l.Decide(ctx, Input{Rule: "minute", Key: shop}, Input{Rule: "day", Key: shop})
	}
	for _, shop := range []string{"busy", "quiet"} {
		if d, err := decide(shop); err != nil || !d.Allowed || d.Results[0].Fallback != inherit {
			t.Fatalf("%s before the resharding: %+v, %v", shop, d, err)
		}
	}
	sum := sha256.Sum256([]byte("busy"))
	tag := "{" + base64.RawURLEncoding.EncodeToString(sum[:16]) + "}"
	finish := halfMove(t, client, "p:"+tag, "p:"+tag+":minute")
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(300 * time.Millisecond)
		finish("p:" + tag + ":day")
	}()
	for i := range 5 {
		if d, err := decide("busy"); err != nil || !d.Allowed {
			t.Errorf("the busy caller, request %d during the move: allowed %v (%v), want admitted", i+1, d.Allowed, err)
		}
	}
	<-done
	d, err := decide("quiet")
	if err != nil || !d.Allowed || d.Results[0].Fallback != inherit {
		t.Errorf("a caller on a healthy slot while another slot is half moved: allowed %v (%v), health %q; want decided by Redis",
			d.Allowed, err, l.Health().Status)
	}
}

// halfMove begins moving slotKey's slot to another master and moves key
// only, leaving the slot's other keys on the source. The func it returns
// moves the rest of the keys and then the slot.
func halfMove(t *testing.T, client *redis.ClusterClient, slotKey, key string) (finish func(rest ...string)) {
	t.Helper()
	src, dst, slot := redistest.MigratingSlot(t, client, slotKey, []string{key})
	return func(rest ...string) { redistest.FinishMigration(t, client, src, dst, slot, rest) }
}
