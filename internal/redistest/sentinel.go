package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master set name of a [SentinelInstance].
const SentinelMaster = "ceiling"

// SentinelInstance is a master, one replica and one Sentinel watching them
// with a quorum of one, so that killing the master promotes the replica
// within about a second.
type SentinelInstance struct {
	Master, Replica, Sentinel *Instance
}

// Sentinel starts a master, a replica and a Sentinel of the calling test's
// own, waits until the replica is in sync and the Sentinel knows both, and
// stops them all when the test ends.
func Sentinel(tb testing.TB) *SentinelInstance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	s := &SentinelInstance{}
	tb.Cleanup(s.Close)
	var err error
	// Without the default 5s wait for more replicas before a diskless sync.
	if s.Master, err = startInstance(bin, kind{extra: []string{"repl-diskless-sync-delay 0"}}); err != nil {
		tb.Fatal(err)
	}
	host, port := "127.0.0.1", strconv.Itoa(s.Master.port)
	if s.Replica, err = startInstance(bin, kind{extra: []string{"replicaof " + host + " " + port}}); err != nil {
		tb.Fatal(err)
	}
	if s.Sentinel, err = startInstance(bin, kind{sentinel: true, extra: []string{
		fmt.Sprintf("sentinel monitor %s %s %s 1", SentinelMaster, host, port),
		"sentinel down-after-milliseconds " + SentinelMaster + " 300",
		"sentinel failover-timeout " + SentinelMaster + " 3000",
	}}); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	replica := redis.NewClient(&redis.Options{Addr: s.Replica.Addr})
	defer replica.Close()
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr})
	defer sentinel.Close()
	s.waitFor(tb, "the replica to sync", func() bool {
		info, err := replica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	s.waitFor(tb, "the Sentinel to see the replica", func() bool {
		replicas, err := sentinel.Replicas(ctx, SentinelMaster).Result()
		return err == nil && len(replicas) == 1
	})
	return s
}

// waitFor polls ok until it holds or startTimeout passes.
func (s *SentinelInstance) waitFor(tb testing.TB, what string, ok func() bool) {
	tb.Helper()
	s.waitForWithin(tb, what, startTimeout, ok)
}

// promoteTimeout bounds a failover: a Sentinel whose first attempt fails
// (the replica not yet ready on a loaded machine) tries again only after
// twice its failover-timeout (3s), so 10s was too short for a second try.
const promoteTimeout = 30 * time.Second

func (s *SentinelInstance) waitForWithin(tb testing.TB, what string, within time.Duration, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: no %s within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a go-redis failover client that finds the master through
// the Sentinel, closed when the test ends, with the same fail-fast settings
// as [Instance.Client].
func (s *SentinelInstance) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            SentinelMaster,
		SentinelAddrs:         []string{s.Sentinel.Addr},
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
	})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Failover kills the master and waits until the Sentinel has promoted the
// replica: what a crashed master looks like to clients.
func (s *SentinelInstance) Failover(tb testing.TB) {
	tb.Helper()
	s.Master.Kill()
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr})
	defer sentinel.Close()
	s.waitForWithin(tb, "promotion of the replica", promoteTimeout, func() bool {
		addr, err := sentinel.GetMasterAddrByName(context.Background(), SentinelMaster).Result()
		return err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(s.Replica.port)
	})
}

// Close stops the three servers. Sentinel registers it with t.Cleanup;
// calling it again is a no-op.
func (s *SentinelInstance) Close() {
	for _, i := range []*Instance{s.Sentinel, s.Replica, s.Master} {
		if i != nil {
			i.Close()
		}
	}
}
