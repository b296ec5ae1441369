package redis

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestMain shares one redis-server and one cluster across the package's
// tests, and fails the run if any goroutine outlives them: the Store starts
// none, so a leak would be a test's client left open or a Store bug.
func TestMain(m *testing.M) {
	code := redistest.Main(m)
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// goRedisAfterClose are go-redis goroutines that outlive a closed client
// for a while by design. After PoolSize failed dials in a row (a killed
// Cluster master: TestClusterFailoverHealsInSeconds), a pool redials in
// a goroutine of its own (tryDial) that sleeps a second between dials and
// sees the pool closed only when it wakes; a ClusterClient's state reload
// (ReloadState, which the Store calls to heal) sleeps 200ms after it.
var goRedisAfterClose = []string{
	"github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial",
	"github.com/redis/go-redis/v9.(*clusterStateHolder).LazyReload.func1",
}

// goRedisGrace bounds how long the leak check waits for goRedisAfterClose
// to end: a second's sleep and one dial, with room for a busy machine.
const goRedisGrace = 10 * time.Second

// findLeaks is goleak.Find, except that it waits up to goRedisGrace for
// goRedisAfterClose to end: every other goroutine must be gone at once (with
// goleak's usual retries), and those too by the deadline.
func findLeaks() error {
	ignore := make([]goleak.Option, len(goRedisAfterClose))
	for i, f := range goRedisAfterClose {
		ignore[i] = goleak.IgnoreAnyFunction(f)
	}
	if err := goleak.Find(ignore...); err != nil {
		return err
	}
	deadline := time.Now().Add(goRedisGrace)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runMiniredis is miniredis.RunT, except that closing it gives up after
// 5s: a script in an endless loop (a broken rolling.lua, say) holds
// miniredis's lock for ever, and its Close waits for that lock, which made
// a failed test hang in its cleanup until go test's -timeout.
func runMiniredis(t testing.TB) *miniredis.Miniredis {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatalf("starting miniredis: %v", err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { m.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Logf("miniredis did not close within 5s (a script that never ends?): left running")
		}
	})
	return m
}

// target is a Redis to run a test against.
type target struct {
	name   string
	client func(t testing.TB) redis.UniversalClient
}

// targets are miniredis (hermetic: always runs), the shared redis-server
// and the shared three-master cluster (skipped without redis-server).
var targets = []target{
	{"miniredis", func(t testing.TB) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: runMiniredis(t).Addr()})
		t.Cleanup(func() { c.Close() })
		return c
	}},
	{"redis", func(t testing.TB) redis.UniversalClient { return redistest.Shared(t).Client(t) }},
	{"cluster", func(t testing.TB) redis.UniversalClient { return redistest.SharedCluster(t).Client(t) }},
}

// forEachTarget runs test once per target, each with a fresh key prefix.
func forEachTarget(t *testing.T, test func(t *testing.T, client redis.UniversalClient, prefix string)) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			test(t, tg.client(t), redistest.KeyPrefix(t))
		})
	}
}

// fakeClock is a settable clock for WithClock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	// An instant on a whole second, so windows of a second start at t0.
	return &fakeClock{now: time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// commandCounter is a go-redis hook counting the commands sent to Redis,
// pipelined ones included.
type commandCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	names []string
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.record(cmd)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *commandCounter) record(cmd redis.Cmder) {
	c.n.Add(1)
	c.mu.Lock()
	c.names = append(c.names, cmd.Name())
	c.mu.Unlock()
}

// sent is the names of the commands recorded since the last reset; a
// Store's background load of the library may record while a test reads.
func (c *commandCounter) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.names)
}

func (c *commandCounter) reset() {
	c.n.Store(0)
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

// countCommands installs a commandCounter on client: on a cluster client,
// on every node client, where the commands really leave.
func countCommands(client redis.UniversalClient) *commandCounter {
	c := &commandCounter{}
	if cc, ok := client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		hooked := map[*redis.Client]bool{}
		add := func(n *redis.Client) {
			mu.Lock()
			defer mu.Unlock()
			if !hooked[n] {
				hooked[n] = true
				n.AddHook(c)
			}
		}
		cc.OnNewNode(add)
		// Nodes created before OnNewNode was registered.
		cc.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
			add(n)
			return nil
		})
		return c
	}
	client.AddHook(c)
	return c
}

func decide(t *testing.T, s *Store, reqs ...backend.Request) []backend.Result {
	t.Helper()
	res, err := s.Decide(context.Background(), reqs)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if len(res) != len(reqs) {
		t.Fatalf("Decide returned %d results for %d requests", len(res), len(reqs))
	}
	return res
}

// flushScripts empties a node's script cache and its function libraries,
// as a restart without persistence does (miniredis has no functions).
func flushScripts(ctx context.Context, node redis.Cmdable) error {
	if err := node.ScriptFlush(ctx).Err(); err != nil {
		return err
	}
	if err := node.FunctionFlush(ctx).Err(); err != nil && !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		return err
	}
	return nil
}

// scriptNames is names without a connection's handshake (HELLO, CLIENT
// SETINFO), which a redialled connection sends before its command: the
// calls of scripts and functions, and FUNCTION LOAD.
func scriptNames(names []string) []string {
	var out []string
	for _, n := range names {
		switch n {
		case "fcall", "eval", "evalsha", "function":
			out = append(out, n)
		}
	}
	return out
}

// waitForLibrary waits until node holds the function library: a Store
// loads it once the call that found it missing is answered.
func waitForLibrary(t *testing.T, node redis.Cmdable) {
	t.Helper()
	waitFor(t, "the library loaded", func() bool {
		libs, err := node.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: libraryName}).Result()
		return err == nil && len(libs) == 1
	})
}

// waitForLibraryOnMasters waits until every master of client holds the
// library, one after the other (ForEachMaster's callbacks run at once).
func waitForLibraryOnMasters(t *testing.T, client *redis.ClusterClient) {
	t.Helper()
	var mu sync.Mutex
	var masters []*redis.Client
	if err := client.ForEachMaster(context.Background(), func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		masters = append(masters, n)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range masters {
		waitForLibrary(t, n)
	}
}
