package ceiling

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Attacks on the failure engine (engine.go, internal/failover) against
// real redis-server processes: a timeout is the backend's fault or this
// process's, and the engine must tell them apart in both directions.

// A Cluster master frozen (SIGSTOP) while the other masters answer is the
// backend's fault: the keys on it must reach their fail mode within about
// the confirming probe's budget (docs/failure.md: "a frozen Redis is
// degraded within about the probe's budget of its first timeout"), not be
// shed with 503 for as long as the freeze lasts while /healthz says
// healthy.
func TestClusterMasterFrozenWhileOthersAnswerReachesTheFailMode_Attack(t *testing.T) {
	shed, failedOpen, _ := frozenMaster(t)
	// The fail mode must apply within about the probe's budget: the
	// victim's requests shed meanwhile are those of that second (each
	// waits out the 100 ms timeout), not all of them.
	if most := int(confirmBudget/(100*time.Millisecond)) + 2; failedOpen == 0 || shed > most {
		t.Errorf("a master frozen for 5 s while others answer: %d requests on it shed with 503, %d failed open; want the fail mode applied within about the probe's budget (%v)", shed, failedOpen, confirmBudget)
	}
}

// A decision on a frozen Cluster master, on an idle process, waits about
// the timeout (docs/failure.md: "waiting for one at most the timeout
// after the write"), not the 2 s the Redis store allows a starved
// process: the other masters' replies say nothing about the frozen one.
func TestClusterFrozenMasterDecisionsWaitAboutTheTimeout_Attack(t *testing.T) {
	_, _, took := frozenMaster(t)
	if m := slices.Max(took); m > time.Second {
		t.Errorf("decisions on a frozen master of an idle process took up to %v (%v), want about the timeout (100ms)", m, took)
	}
}

// frozenMaster freezes one master of a 3-master Cluster for 5 s while a
// FailOpen limiter decides, one request at a time, alternately a key on
// it and a key on another master; it returns how many of the frozen
// master's decisions were shed and failed open, and how long each took.
func frozenMaster(t *testing.T) (shed, failedOpen int, took []time.Duration) {
	// A frozen server's wall-clock timing: on a machine that others load
	// too, this process's own delays shed requests (by design) past the
	// bounds that the callers assert.
	citest.Only(t)
	cl := redistest.Cluster(t)
	ctx := context.Background()
	for _, n := range cl.Nodes {
		if err := n.Client(t).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	var events atomic.Int64
	logs := &syncBuffer{}
	l := MustNew([]Rule{{Name: "shop", Limit: 1_000_000, Period: time.Minute}},
		WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix(prefix))), WithFailMode(FailOpen),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))), onDegraded(func(DegradedEvent) { events.Add(1) }))
	defer l.Close()
	masterOf := func(key string) string {
		t.Helper()
		m, err := client.MasterForKey(ctx, prefix+":"+key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	victim := cl.Nodes[0].Addr
	var onVictim, elsewhere []string
	st := newState(1)
	for i := 0; len(onVictim) < 3 || len(elsewhere) < 3; i++ {
		v := "shop-" + itoa(i)
		if masterOf(l.storedKey(st, "shop", v)) == victim {
			onVictim = append(onVictim, v)
		} else {
			elsewhere = append(elsewhere, v)
		}
	}
	for _, v := range append(onVictim, elsewhere...) {
		if _, err := l.Decide(ctx, Input{Rule: "shop", Key: v}); err != nil {
			t.Fatalf("with every master up: %v", err)
		}
	}

	cl.Node(victim).Freeze(t)
	defer cl.Node(victim).Thaw(t)
	frozen := time.Now()
	var other int
	var lastErr error
	degradedAt := time.Duration(-1)
	// Bounded: 5 s of traffic, one request at a time, half on the frozen
	// master, half on masters that answer (as real traffic would be).
	for i := 0; time.Since(frozen) < 5*time.Second; i++ {
		if _, err := l.Decide(ctx, Input{Rule: "shop", Key: elsewhere[i%len(elsewhere)]}); err != nil {
			other++
		}
		began := time.Now()
		d, err := l.Decide(ctx, Input{Rule: "shop", Key: onVictim[i%len(onVictim)]})
		took = append(took, time.Since(began))
		var ue *UnavailableError
		switch {
		case errors.As(err, &ue):
			shed++
			lastErr = err
		case err != nil:
			t.Fatalf("decision on the frozen master: %v", err)
		case d.Results[0].Fallback == FailOpen:
			failedOpen++
		}
		if degradedAt < 0 && l.Health().Status == "degraded" {
			degradedAt = time.Since(frozen)
		}
	}
	h := l.Health()
	t.Logf("5 s frozen: %d shed (last: %v), %d failed open, %d errors on live masters; health %q reason %q shed %d transitions %d; degraded after %v",
		shed, lastErr, failedOpen, other, h.Status, h.Reason, h.Shed, events.Load(), degradedAt)
	t.Logf("log:\n%s", logs.String())
	t.Logf("decisions on the frozen master took %v", took)
	return shed, failedOpen, took
}

// slowProxy forwards TCP to target, delaying every chunk of the replies
// by delay (each chunk's delay counted from when it came, so latency does
// not pile up): a Redis that answers everything, slowly.
func slowProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	var d atomic.Int64
	d.Store(int64(delay))
	return slowProxyOf(t, target, &d)
}

// slowProxyOf is slowProxy with a delay that may change while it runs.
func slowProxyOf(t *testing.T, target string, delay *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			type chunk struct {
				at time.Time
				b  []byte
			}
			ch := make(chan chunk, 1024)
			wg.Add(3)
			go func() { defer wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() {
				defer wg.Done()
				defer close(ch)
				buf := make([]byte, 64<<10)
				for {
					n, err := u.Read(buf)
					if n > 0 {
						ch <- chunk{time.Now(), append([]byte(nil), buf[:n]...)}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				for k := range ch {
					time.Sleep(time.Until(k.at.Add(time.Duration(delay.Load()))))
					if _, err := c.Write(k.b); err != nil {
						return
					}
				}
			}()
			t.Cleanup(func() { c.Close(); u.Close() })
		}
	}()
	return ln.Addr().String()
}

// A Redis that answers every command, but 250 ms late (past the limiter's
// 100 ms timeout, within the confirming probe's 1 s budget), on an idle
// process, is the backend's fault: the probe that the first timeout
// starts answers, but later than the timeout, and the canary sent again at
// the timeout finds the node silent, so the timeouts are confirmed and the
// limiter degrades within the bound docs/failure.md gives (the probe's
// budget twice, its canary's write may wait for a new connection's
// handshake, plus the timeout for each of the two canaries, the first
// timeout and Failures more), FailOpen admits (counted), and once Redis is
// fast again the prober recovers with no traffic. Before, the probe's
// answer cleared every run of timeouts: FailOpen rules were shed with 503
// for as long as Redis stayed slow, Health healthy, no transition.
func TestSlowRedisIsNotShedForever_Attack(t *testing.T) {
	inst := redistest.Server(t)
	var delay atomic.Int64
	delay.Store(int64(250 * time.Millisecond))
	addr := slowProxyOf(t, inst.Addr, &delay)
	logs := &syncBuffer{}
	var events atomic.Int64
	const timeout = 100 * time.Millisecond // the default
	l := MustNew([]Rule{{Name: "chat", Limit: 1_000_000, Period: time.Minute}},
		WithBackend(storeAt(t, addr, redistest.KeyPrefix(t))), WithFailMode(FailOpen), WithTimeout(timeout),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))), onDegraded(func(DegradedEvent) { events.Add(1) }))
	defer l.Close()
	ctx := context.Background()
	start := time.Now()
	var shed, failedOpen, decided int
	degradedAt := time.Duration(-1)
	// Bounded: 4 s of traffic, one request at a time.
	for i := 0; time.Since(start) < 4*time.Second; i++ {
		d, err := l.Decide(ctx, Input{Rule: "chat", Key: "user-" + itoa(i%10)})
		var ue *UnavailableError
		switch {
		case errors.As(err, &ue):
			shed++
		case err != nil:
			t.Fatal(err)
		case d.Results[0].Fallback == FailOpen:
			failedOpen++
		default:
			decided++
		}
		if degradedAt < 0 && l.Health().Status == "degraded" {
			degradedAt = time.Since(start)
		}
	}
	h := l.Health()
	t.Logf("4 s of a Redis 250 ms slow: %d shed, %d failed open, %d decided; health %q reason %q, shed %d, transitions %d; degraded after %v",
		shed, failedOpen, decided, h.Status, h.Reason, h.Shed, events.Load(), degradedAt)
	bound := 2*confirmBudget + (3+defaultBreakerFailures)*timeout
	if degradedAt < 0 || degradedAt > bound || failedOpen == 0 || h.Status != "degraded" {
		t.Errorf("a Redis 250 ms slow for 4 s: degraded after %v (-1: never), %d shed, %d failed open, health %q; want degraded within %v, then failing open",
			degradedAt, shed, failedOpen, h.Status, bound)
	}

	delay.Store(0)
	fast := time.Now()
	for l.Health().Status != "healthy" && time.Since(fast) < 5*time.Second {
		time.Sleep(10 * time.Millisecond) // real: the prober runs on its own timers
	}
	recovered := time.Since(fast)
	d, err := l.Decide(ctx, Input{Rule: "chat", Key: "user-0"})
	t.Logf("Redis fast again: healthy after %v, idle; transitions %d", recovered, events.Load())
	if l.Health().Status != "healthy" || events.Load() != 2 || err != nil || d.Results[0].Fallback != inherit {
		t.Errorf("Redis fast again, idle: %q after %v, %d transitions, then %v (fallback %v); want healthy within a probe interval, 2 transitions, decided by Redis",
			l.Health().Status, recovered, events.Load(), err, d.Results[0].Fallback)
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}

// A Redis busy in a long-running Lua script answers every other command
// with a BUSY error once busy-reply-threshold passed (here 200 ms): that
// is the backend's failure at once, not an unconfirmed timeout, so the
// limiter degrades within about a second, FailOpen admits (counted), the
// health reason is the kind only, and once the script is killed the
// limiter recovers with no traffic. Held.
func TestRedisBusyInAScriptReachesTheFailModeAndRecovers_Attack(t *testing.T) {
	inst := redistest.Server(t)
	ctx := context.Background()
	admin := inst.Client(t)
	if err := admin.ConfigSet(ctx, "busy-reply-threshold", "200").Err(); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	var events atomic.Int64
	l := MustNew([]Rule{{Name: "chat", Limit: 1_000_000, Period: time.Minute}},
		WithBackend(storeAt(t, inst.Addr, redistest.KeyPrefix(t))), WithFailMode(FailOpen), WithTimeout(loadedTimeout),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))), onDegraded(func(DegradedEvent) { events.Add(1) }))
	defer l.Close()
	if _, err := l.Decide(ctx, Input{Rule: "chat", Key: "u"}); err != nil {
		t.Fatal(err)
	}
	// The script's own client waits for it (no read timeout); bounded by
	// the SCRIPT KILL below, and by redis-server's exit at the test's end.
	busy := redis.NewClient(&redis.Options{Addr: inst.Addr, ReadTimeout: -1})
	t.Cleanup(func() { busy.Close() })
	done := make(chan error, 1)
	go func() { done <- busy.Eval(ctx, "while true do end", nil).Err() }()
	time.Sleep(300 * time.Millisecond) // real: the script starts and passes the threshold
	start := time.Now()
	var shed, failedOpen int
	degradedAt := time.Duration(-1)
	for time.Since(start) < 2*time.Second {
		d, err := l.Decide(ctx, Input{Rule: "chat", Key: "u"})
		var ue *UnavailableError
		switch {
		case errors.As(err, &ue):
			shed++
		case err != nil:
			t.Fatal(err)
		case d.Results[0].Fallback == FailOpen:
			failedOpen++
		}
		if degradedAt < 0 && l.Health().Status == "degraded" {
			degradedAt = time.Since(start)
		}
		time.Sleep(5 * time.Millisecond) // paced: about 400 requests
	}
	h := l.Health()
	if err := admin.Do(ctx, "SCRIPT", "KILL").Err(); err != nil {
		t.Fatalf("SCRIPT KILL: %v", err)
	}
	<-done
	killed := time.Now()
	for l.Health().Status != "healthy" && time.Since(killed) < 5*time.Second {
		time.Sleep(10 * time.Millisecond) // real: the prober runs on its own timers
	}
	recovered := time.Since(killed)
	t.Logf("busy script 2 s: %d shed, %d failed open, health %q reason %q, degraded after %v; idle recovery %v after SCRIPT KILL; transitions %d",
		shed, failedOpen, h.Status, h.Reason, degradedAt, recovered, events.Load())
	if degradedAt < 0 || degradedAt > 1500*time.Millisecond || shed > 5 {
		t.Errorf("a Redis answering BUSY: degraded after %v (-1: never), %d shed; want degraded within about a second, few shed", degradedAt, shed)
	}
	if h.Reason == "" || strings.Contains(string(h.Reason), "BUSY") {
		t.Errorf("health reason %q, want the kind only", h.Reason)
	}
	if l.Health().Status != "healthy" || events.Load() != 2 {
		t.Errorf("after SCRIPT KILL, idle: %q after %v, %d transitions; want healthy within a probe interval, 2 transitions", l.Health().Status, recovered, events.Load())
	}
}

// requestErrs keeps the errors ObserveRequest is told of.
type requestErrs struct {
	NopObserver
	mu   sync.Mutex
	errs []error
}

func (o *requestErrs) ObserveRequest(_ context.Context, _ *Decision, err error) {
	if err != nil {
		o.mu.Lock()
		o.errs = append(o.errs, err)
		o.mu.Unlock()
	}
}

// A FailOpen request shed on an unconfirmed timeout (Redis frozen, no
// probe verdict yet) is counted in Health.Shed, so an observer must be
// able to tell it from a rule failing closed. The observers' rule
// (metrics/prometheus ObserveRequest, metrics/otel) is "shed when the
// UnavailableError's Err wraps backend.ErrNotSent or backend.ErrUnread,
// else fail_closed": this one wrapped neither, so a FailOpen rule was
// exported as ceiling_rate_limiting_requests_total{result="fail_closed"}
// while /healthz counted it shed, and its error said "fails closed".
func TestUnconfirmedTimeoutShedIsObservedAsShed_Attack(t *testing.T) {
	inst := redistest.Server(t)
	obs := &requestErrs{}
	l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 1000, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithObserver(obs), WithTimeout(loadedTimeout),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: time.Hour}), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	if w := get(t, h); w.Code != 200 {
		t.Fatalf("with Redis up: %d", w.Code)
	}
	inst.Freeze(t)
	defer inst.Thaw(t)
	w := get(t, h)
	if w.Code != 503 || l.Health().Shed != 1 {
		t.Skipf("not shed (%d, shed %d): the probe's verdict came first on a loaded machine", w.Code, l.Health().Shed)
	}
	t.Logf("shed: %d %v %s", w.Code, w.Header(), w.Body.String())
	if w.Header().Get("Retry-After") != "1" || w.Header().Get("Content-Type") != "application/problem+json" ||
		strings.Contains(w.Body.String(), "chat") || strings.Contains(w.Body.String(), "127.0.0.1") {
		t.Errorf("shed response: %v %q, want Retry-After 1, a problem body naming neither rule nor address", w.Header(), w.Body.String())
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) != 1 {
		t.Fatalf("ObserveRequest errors: %v, want one", obs.errs)
	}
	var ue *UnavailableError
	if !errors.As(obs.errs[0], &ue) || !(errors.Is(ue.Err, backend.ErrNotSent) || errors.Is(ue.Err, backend.ErrUnread)) {
		t.Errorf("a shed FailOpen request reached the observer as %v: counted fail_closed by the metrics, shed by Health", obs.errs[0])
	}
	if got := obs.errs[0].Error(); strings.Contains(got, "fails closed") || KindOf(obs.errs[0]) != kindOverloaded {
		t.Errorf("a shed FailOpen request's error %q, kind %q: want it named shed, kind overloaded", got, KindOf(obs.errs[0]))
	}
}

// One instance of three sees a Redis 400 ms slow (a slow path: its calls
// pass the 250 ms timeout, its confirming probe's 1 s budget does not)
// while the other two decide on Redis directly, FailLocal: the slow
// instance's timeouts stay unconfirmed or confirmed, and either way it
// adds at most its share to what Redis admits, the documented bound of a
// partition (limit + share in any window). Held.
func TestSlowPathToRedisKeepsFailLocalWithinThePartitionBound_Attack(t *testing.T) {
	inst := redistest.Server(t)
	prefix := redistest.KeyPrefix(t)
	slow := slowProxy(t, inst.Addr, 400*time.Millisecond)
	insts := newInstances(t, []string{slow, inst.Addr, inst.Addr}, prefix)
	stop := make(chan struct{})
	wg := drive(insts, stop)
	time.Sleep(5 * time.Second) // real: the instances decide on Redis, one through the slow path
	close(stop)
	wg.Wait()
	p := edgeRule.Period
	share := int(float64(edgeRule.Limit) / 3)
	all := windowMax(insts, p, time.Time{})
	h := insts[0].l.Health()
	t.Logf("most admitted in 2 s: %d; slow instance: %q, %d admitted, fail-local %d, shed %d, transitions %d",
		all, h.Status, len(insts[0].admitted), h.Rules[0].FailLocalAdmissions, h.Shed, h.DegradedTotal)
	if all > int(edgeRule.Limit)+share {
		t.Errorf("%d admitted in one 2 s window, want at most limit + share = %d", all, int(edgeRule.Limit)+share)
	}
}
