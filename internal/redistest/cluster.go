package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterInstance is a three-master Redis Cluster, every node a
// redis-server on loopback, without replicas ([Cluster], [SharedCluster])
// or with one per master ([ClusterWithReplicas]). Its slots are spread
// evenly by `redis-cli --cluster create`.
type ClusterInstance struct {
	// Nodes are the nodes in the order they were created: the three masters
	// first, then the replicas, if any. After a failover the roles change.
	Nodes []*Instance
}

// Cluster starts a three-master Redis Cluster of the calling test's own and
// stops it when the test ends. Use it for tests that kill or freeze nodes;
// other tests should prefer [SharedCluster].
func Cluster(tb testing.TB) *ClusterInstance {
	tb.Helper()
	server := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	c, err := startCluster(server, cli)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ClusterWithReplicas starts a Redis Cluster of three masters, each with a
// replica that takes over when it fails (cluster-node-timeout is 2s, so a
// killed master's replica is promoted within about 3 to 5 seconds), and
// stops it when the test ends. It waits until every replica is in sync.
func ClusterWithReplicas(tb testing.TB) *ClusterInstance {
	tb.Helper()
	server := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	c, err := startCluster(server, cli, 1)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	if err := c.waitReplicas(); err != nil {
		tb.Fatal(err)
	}
	return c
}

func startCluster(server, cli string, replicas ...int) (*ClusterInstance, error) {
	perMaster := 0
	if len(replicas) > 0 {
		perMaster = replicas[0]
	}
	c := &ClusterInstance{}
	for range 3 * (1 + perMaster) {
		inst, err := startInstance(server, kind{cluster: true})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, inst)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(perMaster), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitOK(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// WaitOK waits until every node reports cluster_state:ok, as after
// restarting a node with [Instance.Restart]: until the nodes have talked to
// each other again, the cluster answers CLUSTERDOWN.
func (c *ClusterInstance) WaitOK(tb testing.TB) {
	tb.Helper()
	if err := c.waitOK(); err != nil {
		tb.Fatal(err)
	}
}

func (c *ClusterInstance) waitOK() error {
	deadline := time.Now().Add(startTimeout)
	for _, n := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		for {
			info, err := client.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				client.Close()
				if err == nil {
					err = errors.New("cluster_state is not ok")
				}
				return fmt.Errorf("redistest: cluster node %s: %w", n.Addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		client.Close()
	}
	return nil
}

// waitReplicas waits until every replica reports its link to its master up.
func (c *ClusterInstance) waitReplicas() error {
	deadline := time.Now().Add(startTimeout)
	for _, n := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		for {
			info, err := client.Info(context.Background(), "replication").Result()
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				client.Close()
				return fmt.Errorf("redistest: cluster node %s: replica not in sync within %v (%v)", n.Addr, startTimeout, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		client.Close()
	}
	return nil
}

// Node returns the node listening on addr, or nil.
func (c *ClusterInstance) Node(addr string) *Instance {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Failover kills the master at addr, as a crash would, and waits until the
// surviving nodes report another node serving its slots (its replica,
// promoted), which it returns. It needs [ClusterWithReplicas].
func (c *ClusterInstance) Failover(tb testing.TB, addr string) *Instance {
	tb.Helper()
	dead := c.Node(addr)
	if dead == nil {
		tb.Fatalf("redistest: no cluster node at %s", addr)
	}
	var probe *Instance
	for _, n := range c.Nodes {
		if n != dead && n.PID() != 0 {
			probe = n
			break
		}
	}
	client := redis.NewClient(&redis.Options{Addr: probe.Addr, MaxRetries: -1})
	defer client.Close()
	ctx := context.Background()
	slots, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatal(err)
	}
	var slot int
	found := false
	for _, r := range slots {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == addr {
			slot, found = r.Start, true
			break
		}
	}
	if !found {
		tb.Fatalf("redistest: %s serves no slot: not a master", addr)
	}
	dead.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		slots, err := client.ClusterSlots(ctx).Result()
		if err == nil {
			for _, r := range slots {
				if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 && r.Nodes[0].Addr != addr {
					if n := c.Node(r.Nodes[0].Addr); n != nil {
						return n
					}
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: no node took over the slots of %s within 30s (%v)", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addrs returns the nodes' addresses, what redis.ClusterOptions.Addrs takes.
func (c *ClusterInstance) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a go-redis cluster client for the cluster, closed when the
// test ends, with the same fail-fast settings as [Instance.Client].
func (c *ClusterInstance) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, DialerRetries: 1})
	tb.Cleanup(func() { client.Close() })
	return client
}

// Close kills every node and removes their directories. Cluster registers it
// with t.Cleanup; calling it again is a no-op.
func (c *ClusterInstance) Close() {
	for _, n := range c.Nodes {
		n.Close()
	}
}
