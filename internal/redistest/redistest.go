// Package redistest starts real redis-server processes for tests: a single
// server ([Server], [Shared]), a three-master Redis Cluster ([Cluster],
// [SharedCluster]) and a master with a replica under a Sentinel
// ([Sentinel]), each on free loopback ports with its own temporary
// directory, no persistence, and stopped by PID when the test (or, for the
// shared ones, the test binary) ends. A [Proxy] in front of a server loses
// replies, stalls or cuts connections, for tests of network faults.
//
// Without redis-server (and, for clusters, redis-cli) on PATH the helpers
// skip the test and say how to run it, unless the environment variable
// CEILING_REQUIRE_REDIS=1 is set (CI sets it), which turns the skip into a
// failure so that a missing Redis can never pass silently. A skip is also
// never silent without -v: [Main] prints one line per package naming how
// many tests skipped and why.
//
// Tests that need a server of their own to kill, freeze or restart use
// [Server]; tests that only store keys share one server per test binary
// through [Shared] and keep apart by a unique [KeyPrefix] instead of FLUSHDB.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure instead of a skip.
const RequireEnv = "CEILING_REQUIRE_REDIS"

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// lookPath finds a Redis binary, skipping (or failing, under RequireEnv) the
// test when it is missing.
func lookPath(tb testing.TB, name string) string {
	tb.Helper()
	requireMain(tb)
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("redistest: %s not found on PATH (%v); install Redis 6.2 or newer "+
		"(for example `apt-get install redis-server`, which brings redis-cli too) to run the Redis tests; "+
		"set %s=1 to make this a failure instead of a skip", name, err, RequireEnv)
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatal(msg)
		return ""
	}
	skipped(name)
	tb.Skip(msg)
	return ""
}

// Instance is one redis-server process listening on a loopback port.
//
// Its methods are safe for simultaneous use by multiple goroutines. The port
// stays the same across [Instance.Restart], so clients reconnect to it.
type Instance struct {
	// Addr is the server's "127.0.0.1:port" address.
	Addr string

	bin  string
	dir  string
	port int
	kind kind

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Server starts a redis-server of the calling test's own on a free loopback
// port and stops it when the test ends. Use it for tests that kill, freeze
// or restart the server; other tests should prefer [Shared].
func Server(tb testing.TB) *Instance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	inst, err := startInstance(bin, kind{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(inst.Close)
	return inst
}

// ServerWith is [Server] with more configuration lines, such as
// "requirepass secret", "replicaof 127.0.0.1 6379" or "maxmemory 1mb", for
// tests of a server configured the way a user's might be. Its start logs
// in with the configuration's requirepass, to check who answers.
func ServerWith(tb testing.TB, config ...string) *Instance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	inst, err := startInstance(bin, kind{extra: config})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(inst.Close)
	return inst
}

// kind says what a server is besides a plain redis-server.
type kind struct {
	cluster  bool     // a cluster node
	sentinel bool     // a Sentinel (redis-server --sentinel)
	extra    []string // more configuration lines
}

// startInstance picks free ports until a server starts on one: another
// process may take a port between the check and the server's bind.
func startInstance(bin string, k kind) (*Instance, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var lastErr error
	for range 5 {
		port, err := freePort(k.cluster)
		if err != nil {
			lastErr = err
			continue
		}
		inst := &Instance{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:  bin,
			dir:  dir,
			port: port,
			kind: k,
		}
		if lastErr = inst.start(); lastErr == nil {
			return inst, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// freePort returns a loopback port nobody listens on. A cluster node also
// needs port+10000 for its cluster bus, so both are checked.
func freePort(cluster bool) (int, error) {
	if !cluster {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("redistest: finding a free port: %w", err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	for range 50 {
		port := 20000 + rand.IntN(30000)
		if portFree(port) && portFree(port+10000) {
			return port, nil
		}
	}
	return 0, errors.New("redistest: no free port pair for a cluster node")
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// config is the server's configuration: loopback only, no persistence, so
// a restart comes back empty (a cluster node keeps only its nodes.conf).
func (i *Instance) config() string {
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(i.port),
		"dir " + i.dir,
		`save ""`,
		"appendonly no",
		"daemonize no",
		"logfile " + filepath.Join(i.dir, "redis.log"),
	}
	if i.kind.cluster {
		lines = append(lines,
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			"cluster-node-timeout 2000",
		)
	}
	lines = append(lines, i.kind.extra...)
	return strings.Join(lines, "\n") + "\n"
}

// start runs the server and waits until it answers PING.
func (i *Instance) start() error {
	conf := filepath.Join(i.dir, "redis.conf")
	if err := os.WriteFile(conf, []byte(i.config()), 0o600); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	args := []string{conf}
	if i.kind.sentinel {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(i.bin, args...)
	cmd.Dir = i.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting %s: %w", i.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	i.mu.Lock()
	i.cmd, i.exited = cmd, exited
	i.mu.Unlock()
	if err := waitReady(i.Addr, exited, cmd.Process.Pid, i.password()); err != nil {
		i.Kill()
		log, _ := os.ReadFile(filepath.Join(i.dir, "redis.log"))
		return fmt.Errorf("redistest: redis-server on %s: %w\n%s", i.Addr, err, lastLines(string(log), 5))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls PING until the server answers, it exits, or startTimeout
// passes. The answer must come from pid, the process just started: one
// whose port another redis-server holds (another test binary's, which took
// freePort's port first) exits at once, while the other server answers.
func waitReady(addr string, exited <-chan struct{}, pid int, password string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, Password: password})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		if err == nil {
			err = answeredBy(ctx, c, pid)
		}
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, errNotOurs) {
			return err
		}
		select {
		case <-exited:
			return errors.New("exited before answering PING")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %w", startTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errNotOurs: the server on the port is another process's.
var errNotOurs = errors.New("the port is held by another redis-server")

// answeredBy checks that the server c reaches is process pid.
func answeredBy(ctx context.Context, c *redis.Client, pid int) error {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%w (pid %s, not %d)", errNotOurs, v, pid)
			}
			return nil
		}
	}
	return fmt.Errorf("redistest: INFO server names no process_id")
}

// password is the requirepass of the server's configuration, if any, so
// that waitReady can ask it who it is.
func (i *Instance) password() string {
	for _, l := range i.kind.extra {
		if v, ok := strings.CutPrefix(l, "requirepass "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// PID returns the server's process id, or 0 when it is not running.
func (i *Instance) PID() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd == nil || i.cmd.Process == nil {
		return 0
	}
	select {
	case <-i.exited:
		return 0
	default:
		return i.cmd.Process.Pid
	}
}

// Client returns a go-redis client for the server, closed when the test
// ends. It honours context deadlines (ContextTimeoutEnabled) and dials only
// once per attempt, so tests of a killed or frozen server fail fast.
func (i *Instance) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: i.Addr, ContextTimeoutEnabled: true, DialerRetries: 1})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Kill stops the server with SIGKILL and waits for it to exit, as a crash
// would: clients see refused connections until [Instance.Restart]. It is a
// no-op when the server is not running.
func (i *Instance) Kill() {
	i.mu.Lock()
	cmd, exited := i.cmd, i.exited
	i.mu.Unlock()
	if cmd == nil {
		return
	}
	// SIGKILL also ends a frozen (SIGSTOPped) process.
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Freeze suspends the server with SIGSTOP: connections stay open and
// commands hang, as with a server stuck in a long operation or a network
// partition. [Instance.Thaw] resumes it.
func (i *Instance) Freeze(tb testing.TB) {
	tb.Helper()
	i.signal(tb, syscall.SIGSTOP)
}

// Thaw resumes a server suspended by [Instance.Freeze] with SIGCONT.
func (i *Instance) Thaw(tb testing.TB) {
	tb.Helper()
	i.signal(tb, syscall.SIGCONT)
}

func (i *Instance) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	pid := i.PID()
	if pid == 0 {
		tb.Fatalf("redistest: %v to %s: server not running", sig, i.Addr)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		tb.Fatalf("redistest: %v to %s (pid %d): %v", sig, i.Addr, pid, err)
	}
}

// Restart kills the server if it runs and starts it again on the same port,
// empty (nothing is persisted), waiting until it answers PING.
func (i *Instance) Restart(tb testing.TB) {
	tb.Helper()
	i.Kill()
	// The old process's port can linger briefly; retry for a while.
	var err error
	for range 20 {
		if err = i.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("redistest: restarting %s: %v", i.Addr, err)
}

// Close kills the server and removes its directory. Server registers it
// with t.Cleanup; calling it again is a no-op.
func (i *Instance) Close() {
	i.Kill()
	os.RemoveAll(i.dir)
}

var prefixSeq atomic.Uint64

// KeyPrefix returns a key prefix unique to this call, derived from the
// test's name, so tests sharing a server never see each other's keys. It
// holds only letters, digits, '_' and '-' (no '{' that would form a Redis
// Cluster hash tag).
func KeyPrefix(tb testing.TB) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, tb.Name())
	return fmt.Sprintf("t%d_%s_%d", prefixSeq.Add(1), name, os.Getpid())
}
