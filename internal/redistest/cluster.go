package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterInstance is a three-master Redis Cluster without replicas, every
// node a redis-server on loopback. Its slots are spread evenly by
// `redis-cli --cluster create`.
type ClusterInstance struct {
	// Nodes are the three masters, in the order they were created.
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

func startCluster(server, cli string) (*ClusterInstance, error) {
	c := &ClusterInstance{}
	for range 3 {
		inst, err := startInstance(server, kind{cluster: true})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, inst)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
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
