package redis

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A renewal of a live lease on a key with nothing expired reads what it
// must and writes the lease's expiry, the companion's clock and the two
// TTLs: no EXISTS beside ZCARD, no scan for expired leases when the
// earliest one is live, and no rewrite of units it did not change.
func TestConcurrencyRenewalCommands(t *testing.T) {
	srv := redistest.Server(t)
	client := srv.Client(t)
	ctx := context.Background()
	s := New(client, WithDenyCache(0))
	lease := func(id int64) backend.Request {
		return backend.Request{Key: "c", Algorithm: backend.Concurrency, Limit: 10, Period: time.Hour, Cost: 1, Lease: id}
	}
	decide(t, s, lease(1))
	decide(t, s, lease(2))
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if res := decide(t, s, lease(1))[0]; !res.Allowed || res.Remaining != 8 {
		t.Fatalf("renewal: %+v, want allowed with 8 remaining", res)
	}
	info, err := client.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	total := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, stats, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "cmdstat_"), ":calls=")
		if !ok || name == "fcall" || name == "evalsha" || name == "eval" || strings.HasPrefix(name, "function|") || name == "config|resetstat" || name == "info" {
			continue
		}
		n, _ := strconv.Atoi(stats[:strings.IndexByte(stats, ',')])
		calls[name] += n
		total += n
	}
	if got, want := total, 11; got > want {
		t.Errorf("a renewal ran %d Redis commands, want at most %d: %v", got, want, calls)
	}
	for _, cmd := range []string{"exists", "zrangebyscore"} {
		if calls[cmd] != 0 {
			t.Errorf("a renewal ran %s: %v", cmd, calls)
		}
	}
	if got := client.HGet(ctx, companionOf(s.prefix+"c"), "1").Val(); got != "1" {
		t.Errorf("the renewed lease holds %q units, want 1", got)
	}
}
