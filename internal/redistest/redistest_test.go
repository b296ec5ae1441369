package redistest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestServerRestartKeepsPortAndComesBackEmpty(t *testing.T) {
	s := Server(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr
	s.Restart(t)
	if s.Addr != addr {
		t.Fatalf("Addr after restart = %s, want %s", s.Addr, addr)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatalf("EXISTS after restart: %v", err)
	}
	if n != 0 {
		t.Fatal("key survived a restart: the server persisted data")
	}
}

func TestServerKillRefusesUntilRestart(t *testing.T) {
	s := Server(t)
	c := s.Client(t)
	ctx := context.Background()
	s.Kill()
	if s.PID() != 0 {
		t.Fatalf("PID after Kill = %d, want 0", s.PID())
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a killed server")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
}

// A server started on a port another redis-server holds exits at once
// (the bind fails), and the one already there answers PING: start must
// fail, as startInstance's retry on another port and Restart expect, not
// return an Instance whose Addr reaches another process's server. Test
// binaries of different packages start servers at once, so freePort's
// port can be taken before the bind; a test would then share that other
// binary's server, whose restart empties its keys (a Concurrency rule's
// leases: more handlers than the limit) and whose end refuses every call.
func TestStartOnATakenPortFails(t *testing.T) {
	// the owner asks for a password, which the new server does not know:
	// its NOAUTH is not the new server's answer either
	for _, config := range [][]string{nil, {"requirepass s3cret"}} {
		owner := ServerWith(t, config...)
		for range 5 {
			inst := &Instance{Addr: owner.Addr, bin: owner.bin, dir: t.TempDir(), port: owner.port}
			if err := inst.start(); err == nil {
				t.Fatalf("start on %s, held by pid %d (config %q), succeeded with pid %d: the Instance reaches another process's server",
					owner.Addr, owner.PID(), config, inst.PID())
			}
		}
		c := redis.NewClient(&redis.Options{Addr: owner.Addr, Password: owner.password()})
		defer c.Close()
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatalf("the owner's server (config %q) after the failed starts: %v", config, err)
		}
	}
}

func TestServerFreezeHangsUntilThaw(t *testing.T) {
	s := Server(t)
	c := s.Client(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	s.Freeze(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := c.Ping(ctx).Err()
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(strings.ToLower(err.Error()), "timeout") {
		t.Fatalf("PING to a frozen server: err = %v, want a timeout", err)
	}
	s.Thaw(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after thaw: %v", err)
	}
}

func TestServerStoppedWhenTestEnds(t *testing.T) {
	var pid int
	if !t.Run("inner", func(t *testing.T) {
		pid = Server(t).PID()
	}) {
		t.Fatal("inner test failed")
	}
	if pid == 0 {
		t.Skip("inner test skipped: no redis-server on PATH")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("server pid %d after its test ended: kill(0) = %v, want ESRCH", pid, err)
	}
}

func TestSharedIsOneServer(t *testing.T) {
	a, b := Shared(t), Shared(t)
	if a != b {
		t.Fatalf("Shared returned two servers: %s and %s", a.Addr, b.Addr)
	}
	if err := a.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestClusterServesEverySlot(t *testing.T) {
	cl := SharedCluster(t)
	if got, want := len(cl.Nodes), 3; got != want {
		t.Fatalf("nodes = %d, want %d", got, want)
	}
	c := cl.Client(t)
	ctx := context.Background()
	// Keys spread over the slot space land on all three masters.
	prefix := KeyPrefix(t)
	for i := range 30 {
		key := prefix + ":" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := c.Set(ctx, key, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
	}
	// ForEachMaster runs concurrently, one goroutine per master.
	var masters, holding atomic.Int32
	err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		masters.Add(1)
		n, err := node.DBSize(ctx).Result()
		if n > 0 {
			holding.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := masters.Load(), int32(3); got != want {
		t.Fatalf("masters = %d, want %d", got, want)
	}
	if got, want := holding.Load(), int32(3); got != want {
		t.Fatalf("masters holding keys = %d, want %d", got, want)
	}
}

func TestKeyPrefixIsUniqueAndHasNoHashTag(t *testing.T) {
	a, b := KeyPrefix(t), KeyPrefix(t)
	if a == b {
		t.Fatalf("KeyPrefix returned %q twice", a)
	}
	t.Run("{braces}", func(t *testing.T) {
		if p := KeyPrefix(t); strings.ContainsAny(p, "{}") {
			t.Fatalf("KeyPrefix = %q, contains a hash tag brace", p)
		}
	})
}

// recordingTB records Skip and Fatal instead of stopping the test, to
// observe what lookPath decides.
type recordingTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordingTB) Helper()           {}
func (r *recordingTB) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recordingTB) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }

func TestMissingRedisSkipsUnlessRequired(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	// The skips recorded here are not this package's: Main must not report them.
	skips.mu.Lock()
	saved := maps.Clone(skips.n)
	skips.n = nil
	skips.mu.Unlock()
	t.Cleanup(func() {
		skips.mu.Lock()
		skips.n = saved
		skips.mu.Unlock()
	})

	t.Setenv(RequireEnv, "")
	r := &recordingTB{TB: t}
	lookPath(r, "redis-server")
	if r.skipped == "" || r.failed != "" {
		t.Fatalf("without %s: skipped=%q failed=%q, want a skip", RequireEnv, r.skipped, r.failed)
	}
	if !strings.Contains(r.skipped, "install Redis") {
		t.Errorf("skip message %q does not say how to run the tests", r.skipped)
	}
	lookPath(&recordingTB{TB: t}, "redis-server")
	lookPath(&recordingTB{TB: t}, "redis-cli")
	want := "redistest: example.com/p: 3 Redis tests SKIPPED: redis-cli and redis-server not found on PATH"
	if got := skipReport("example.com/p"); !strings.HasPrefix(got, want) || !strings.Contains(got, RequireEnv+"=1") {
		t.Errorf("report %q, want it to start %q and name %s", got, want, RequireEnv)
	}

	t.Setenv(RequireEnv, "1")
	r = &recordingTB{TB: t}
	lookPath(r, "redis-server")
	if r.failed == "" || r.skipped != "" {
		t.Fatalf("with %s=1: skipped=%q failed=%q, want a failure", RequireEnv, r.skipped, r.failed)
	}
}

func TestSentinelFailoverPromotesReplica(t *testing.T) {
	s := Sentinel(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	s.Failover(t)
	// The failover client follows the Sentinel to the promoted replica.
	var err error
	for range 50 {
		if err = c.Set(ctx, "k2", "v", time.Minute).Err(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("SET after failover: %v", err)
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := "tcp_port:" + strconv.Itoa(s.Replica.port); !strings.Contains(info, want) {
		t.Errorf("client talks to a server without %s: not the promoted replica", want)
	}
}

// TestServerDiesWithTestBinary runs this test binary again as a child that
// starts a server and exits without its cleanups, as a panic or a timeout
// would: the server must not outlive it.
func TestServerDiesWithTestBinary(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("relies on Linux's parent-death signal")
	}
	if os.Getenv("REDISTEST_ORPHAN_CHILD") == "1" {
		inst, err := startInstance(lookPath(t, "redis-server"), kind{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("pid", inst.PID(), inst.dir)
		os.Exit(0) // no cleanup
	}
	lookPath(t, "redis-server")
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithTestBinary$")
	cmd.Env = append(os.Environ(), "REDISTEST_ORPHAN_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var pid int
	var dir string
	if _, err := fmt.Sscanf(string(out), "pid %d %s", &pid, &dir); err != nil || pid == 0 {
		t.Fatalf("child printed %q, want its server's pid and directory", out)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("server pid %d outlived the test binary that started it", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// What the README's test command prints without redis-server: go test
// hides a passing package's output unless -v, so the skip line must reach
// the go command's own standard error, and must not garble a log file that
// go test writes.
func TestGoTestShowsSkipsWithoutV(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("runs go test; the line reaches the go command through Linux's /proc")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	noRedis := t.TempDir()
	if err := os.Symlink(goBin, noRedis+"/go"); err != nil {
		t.Fatal(err)
	}
	const line = "redistest: github.com/ceiling-go/ceiling/internal/redistest: 1 Redis test SKIPPED: redis-server not found on PATH"
	// goTest runs the package's one shared-server test with the go
	// command's output going to out, and returns what it printed.
	goTest := func(t *testing.T, out *os.File) string {
		cmd := exec.Command("go", "test", "-count=1", "-run", "^TestSharedIsOneServer$", ".")
		cmd.Env = append(os.Environ(), "PATH="+noRedis, RequireEnv+"=")
		var buf strings.Builder
		cmd.Stdout, cmd.Stderr = &buf, &buf // a pipe
		if out != nil {
			cmd.Stdout, cmd.Stderr = out, out
		}
		if err := cmd.Run(); err != nil {
			t.Fatalf("go test: %v\n%s", err, buf.String())
		}
		if out == nil {
			return buf.String()
		}
		b, err := os.ReadFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ok := regexp.MustCompile(`(?m)^ok  \tgithub.com/ceiling-go/ceiling/internal/redistest\t\S+\n`)
	t.Run("pipe", func(t *testing.T) {
		got := goTest(t, nil)
		if !strings.Contains(got, line) || !ok.MatchString(got) {
			t.Errorf("go test printed\n%s\nwant the line %q and an ok line", got, line)
		}
	})
	t.Run("file appended to", func(t *testing.T) {
		f, err := os.OpenFile(t.TempDir()+"/log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if got := goTest(t, f); !strings.Contains(got, line) || !ok.MatchString(got) {
			t.Errorf("go test wrote\n%s\nwant the line %q and an ok line", got, line)
		}
	})
	t.Run("file overwritten", func(t *testing.T) {
		f, err := os.Create(t.TempDir() + "/log")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if got := goTest(t, f); !regexp.MustCompile(`\A` + ok.String() + `\z`).MatchString(got) {
			t.Errorf("go test wrote\n%q\nwant its ok line alone: the skip line would be garbled by it", got)
		}
	})
}
