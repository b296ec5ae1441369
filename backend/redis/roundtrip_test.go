package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// threeRules is a request under three rules, each its own key and
// algorithm: a minute limit, a day limit and a per-IP limit.
func threeRules(user string) []backend.Request {
	return []backend.Request{
		{Key: "minute:" + user, Algorithm: backend.SlidingLog, Limit: 30, Period: time.Minute, Cost: 1},
		{Key: "day:" + user, Algorithm: backend.GCRA, Limit: 1000, Period: 24 * time.Hour, Cost: 1},
		{Key: "ip:" + user, Algorithm: backend.FixedWindow, Limit: 100, Period: time.Minute, Cost: 1},
	}
}

// TestThreeRulesTakeOneRoundTrip decides three rules with one command, on
// redis-server with the function library, and on miniredis, which has no
// functions, with EVALSHA.
func TestThreeRulesTakeOneRoundTrip(t *testing.T) {
	for _, tg := range targets[:2] { // miniredis and redis-server: one node
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			count := countCommands(client)
			s := New(client, WithPrefix(redistest.KeyPrefix(t)))
			ctx := context.Background()
			if err := client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			// A server without the library costs one more round trip, then
			// the load; one without functions makes the Store send EVALSHA.
			then := "fcall"
			if tg.name == "miniredis" {
				then = "evalsha"
			} else if err := client.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			count.reset()
			decide(t, s, threeRules("a")...)
			if got := strings.Join(scriptNames(count.sent()), ","); !strings.HasPrefix(got, "fcall,eval") {
				t.Fatalf("first decision sent %s, want fcall, then eval", got)
			}
			if tg.name != "miniredis" {
				waitForLibrary(t, client)
			}
			for i := range 3 {
				count.reset()
				decide(t, s, threeRules("a")...)
				if got := strings.Join(count.sent(), ","); got != then {
					t.Fatalf("decision %d sent %s, want %s: one round trip", i+2, got, then)
				}
			}
		})
	}
}

func TestClusterTakesOneScriptPerSlot(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	count := countCommands(client)
	ctx := context.Background()
	prefix := redistest.KeyPrefix(t)

	// A hash-tagged prefix puts every key in one slot: one script.
	tagged := New(client, WithPrefix("{"+prefix+"}"))
	decide(t, tagged, threeRules("a")...) // the library may be missing: loaded after it
	waitForLibraryOnMasters(t, client)
	count.reset()
	decide(t, tagged, threeRules("a")...)
	if got, want := count.n.Load(), int64(1); got != want {
		t.Errorf("single-slot request: %d commands %v, want %d", got, count.sent(), want)
	}

	s := New(client, WithPrefix(prefix))
	reqs := threeRules("a")
	slots := map[uint16]bool{}
	for _, r := range reqs {
		slots[slot(prefix+":"+r.Key)] = true
	}
	if len(slots) != 3 {
		t.Fatalf("test keys fall in %d slots, want 3", len(slots))
	}
	decide(t, s, reqs...)
	count.reset()
	res, err := s.Decide(ctx, reqs)
	if err != nil {
		t.Fatalf("cross-slot Decide: %v", err)
	}
	for i, r := range res {
		if !r.Allowed {
			t.Errorf("rule %d rejected: %+v", i, r)
		}
	}
	if got, want := count.n.Load(), int64(3); got != want {
		t.Errorf("three-slot request: %d commands %v, want %d (one script per slot)", got, count.sent(), want)
	}
}

// TestScriptCacheRecovery empties the script cache and the function
// libraries, as a restart without persistence does, and decides on: the
// FCALL (or, without functions, EVALSHA) a node cannot run is answered by
// EVAL, transparently.
func TestScriptCacheRecovery(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		ctx := context.Background()
		flush := func() {
			t.Helper()
			var err error
			if cc, ok := client.(*redis.ClusterClient); ok {
				err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
					return flushScripts(ctx, n)
				})
			} else {
				err = flushScripts(ctx, client)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for round := range 3 {
			flush()
			res, err := s.Decide(ctx, threeRules("u"))
			if err != nil {
				t.Fatalf("round %d after the flush: %v", round, err)
			}
			if got, want := res[0].Remaining, int64(30-1-round); got != want {
				t.Fatalf("round %d: remaining %d, want %d", round, got, want)
			}
		}
	})
}

// TestScriptCacheRecoveryAfterRestart restarts the server under a Store:
// the connection drops and the new server has an empty script cache.
func TestScriptCacheRecoveryAfterRestart(t *testing.T) {
	srv := redistest.Server(t)
	s := New(srv.Client(t))
	ctx := context.Background()
	decide(t, s, threeRules("u")...)
	srv.Restart(t)
	res, err := s.Decide(ctx, threeRules("u"))
	if err != nil {
		t.Fatalf("Decide after a restart: %v", err)
	}
	// Nothing was persisted: the quota starts over.
	if got, want := res[0].Remaining, int64(29); got != want {
		t.Fatalf("remaining = %d, want %d", got, want)
	}
}

// TestClusterNodeRestart restarts every master of a cluster under a Store:
// connections drop and nodes lose their library, and once the cluster is
// ok again the next cross-slot decision succeeds (the FCALL a node cannot
// run answered by EVAL, dropped connections redialled by go-redis), and
// the one after it finds the library loaded again.
func TestClusterNodeRestart(t *testing.T) {
	cl := redistest.Cluster(t)
	client := cl.Client(t)
	s := New(client, WithDenyCache(0))
	reqs := threeRules("u")
	decide(t, s, reqs...)
	count := countCommands(client)
	for _, n := range cl.Nodes {
		n.Restart(t)
	}
	cl.WaitOK(t)
	res, err := s.Decide(context.Background(), reqs)
	if err != nil {
		t.Fatalf("Decide after every master restarted: %v", err)
	}
	if !containsName(count.sent(), "eval") {
		t.Errorf("commands %v: no EVAL, so the lost libraries were not exercised", count.sent())
	}
	for _, n := range cl.Nodes {
		waitForLibrary(t, n.Client(t))
	}
	count.reset()
	if _, err := s.Decide(context.Background(), []backend.Request{reqs[0]}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(scriptNames(count.sent()), ","); got != "fcall" {
		t.Errorf("a lone decision after the recovery sent %s, want fcall: the library loaded again", got)
	}
	// Nothing was persisted: every rule starts over.
	for i, want := range []int64{29, 999, 99} {
		if !res[i].Allowed || res[i].Remaining != want {
			t.Errorf("rule %d: %+v, want allowed with %d remaining", i, res[i], want)
		}
	}
}

// TestSentinelFailover kills the master under a Store on a Sentinel
// failover client: the promoted replica never saw the script (replicas get
// the script's writes, not the script), and the next decision loads it
// transparently and continues from the replicated state.
func TestSentinelFailover(t *testing.T) {
	sen := redistest.Sentinel(t)
	client := sen.Client(t)
	s := New(client, WithDenyCache(0))
	ctx := context.Background()
	decide(t, s, threeRules("u")...)
	waitForLibrary(t, client) // a fresh master gets it once the call is answered
	// The state and the library reach the replica before the master dies.
	if err := client.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
		t.Fatal(err)
	}
	sen.Failover(t)
	count := countCommands(client)
	var res []backend.Result
	var err error
	// The first attempts may still reach the dead master's address, until
	// the client hears of the promotion.
	for range 50 {
		if res, err = s.Decide(ctx, threeRules("u")); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("Decide after failover: %v", err)
	}
	if got, want := res[0].Remaining, int64(28); got != want {
		t.Errorf("remaining after failover = %d, want %d (the replicated state)", got, want)
	}
	// The library reached the replica with the state: no EVAL.
	if !containsName(count.sent(), "fcall") || containsName(count.sent(), "eval") {
		t.Errorf("commands %v after failover, want FCALL alone: the promoted replica had the library", count.sent())
	}
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
