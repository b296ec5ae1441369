package ceiling

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Faults at the edges of the failure handling, against real redis-server
// processes: what moves the breaker, clients that leave, recovery without
// traffic, FailLocal across the edges of an outage and of a partition, and
// a starved CPU on a healthy Redis.

// storeAt returns a Store on a default go-redis client for addr under
// prefix, so that several "instances" can share one Redis's keys.
func storeAt(t *testing.T, addr, prefix string, opts ...ceilingredis.Option) *ceilingredis.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return ceilingredis.New(c, append([]ceilingredis.Option{ceilingredis.WithPrefix(prefix)}, opts...)...)
}

func fromAddr(h http.Handler, addr string) int {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr + ":1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// Half the traffic on a key the deny cache answers, then Redis killed: the
// cached answers are not the backend's, so the breaker opens after the
// configured 5 failures of the other half, and stays open however many
// cached answers follow (issue 12.1).
func TestRedisKilledWithDenyCachedTrafficOpensTheBreaker(t *testing.T) {
	inst := redistest.Server(t)
	var mu sync.Mutex
	var events []DegradedEvent
	l := MustNew([]Rule{{Name: "chat", Key: RemoteAddr, Limit: 3, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithTimeout(loadedTimeout), WithLogger(slog.New(slog.DiscardHandler)),
		onDegraded(func(e DegradedEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	defer l.Close()
	h := l.Handler(okHandler)
	for range 4 {
		fromAddr(h, "198.51.100.1") // spent: the fourth is refused and deny-cached
	}
	fresh := 0
	next := func() int { fresh++; return fromAddr(h, "203.0.113."+itoa(fresh)) }
	if got := next(); got != 200 {
		t.Fatalf("with Redis up: %d", got)
	}
	inst.Kill()
	killed := time.Now()
	failures := 0
	for l.Health().Status == "healthy" {
		if failures > defaultBreakerFailures {
			t.Fatalf("still healthy after %d failed requests interleaved with deny-cached answers", failures)
		}
		if got := fromAddr(h, "198.51.100.1"); got != 429 {
			t.Fatalf("the spent key, from the deny cache: %d, want 429", got)
		}
		next()
		failures++
	}
	t.Logf("degraded after %d failures, %v after the kill", failures, time.Since(killed))
	if failures != defaultBreakerFailures {
		t.Errorf("degraded after %d failures, want %d", failures, defaultBreakerFailures)
	}
	for range 200 {
		fromAddr(h, "198.51.100.1")
		next()
	}
	time.Sleep(1500 * time.Millisecond) // a probe or two against the dead Redis
	if h := l.Health(); h.Status != "degraded" || h.DegradedTotal != 1 || h.Reason != "unreachable" {
		t.Errorf("health %+v: want degraded once, unreachable", h)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 {
		t.Errorf("events %+v, want one degradation and no recovery while Redis is dead", events)
	}
}

// Clients that send their request and half-close the connection (Go's
// server then cancels the request's context) against a limit on Redis: the
// decision is the backend's whatever the client does, so no more than the
// limit reach the handler, failing open or local alike, and the limiter
// stays healthy (issue 12.2). Both of the cases: 200 clients
// against 5 per minute on one key, and 50 POSTs of one phone number in a
// JSON body against 3 SMS a minute keyed by that body field (where 13 got
// through).
func TestHalfClosedClientsGetNoFreeRequests(t *testing.T) {
	inst := redistest.Shared(t)
	// The key functions wait until the client has gone, so the decision is
	// always made for a cancelled request. The body field's reads the body
	// first: Go's server watches for the client leaving only once the
	// body is read.
	var calls, cancelled atomic.Int64
	untilGone := func(r *http.Request) {
		calls.Add(1)
		select {
		case <-r.Context().Done():
			cancelled.Add(1)
		case <-time.After(5 * time.Second):
		}
	}
	phone := Must(BodyField("phone"))
	const body = `{"phone":"+447400900777"}`
	for _, tc := range []struct {
		name    string
		key     KeyFunc
		limit   int64
		clients int
		request string
	}{
		{"one key", func(r *http.Request) (string, error) { untilGone(r); return "one-client", nil }, 5, 200,
			"GET / HTTP/1.1\r\nHost: ceiling\r\n\r\n"},
		{"body field", func(r *http.Request) (string, error) { k, err := phone(r); untilGone(r); return k, err }, 3, 50,
			"POST /sms HTTP/1.1\r\nHost: ceiling\r\nContent-Type: application/json\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body},
	} {
		for _, mode := range []FailMode{FailOpen, FailLocal} {
			t.Run(tc.name+"/"+mode.String(), func(t *testing.T) {
				calls.Store(0)
				cancelled.Store(0)
				var reached atomic.Int64
				// A generous timeout: this is about clients leaving, not about a
				// Redis slowed by a loaded CI machine.
				l := MustNew([]Rule{{Name: "sms", Key: tc.key, Limit: tc.limit, Period: time.Minute}},
					WithBackend(redisStore(t, inst)), WithFailMode(mode), WithTimeout(2*time.Second),
					WithLogger(slog.New(slog.DiscardHandler)))
				defer l.Close()
				srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) })))
				defer srv.Close()
				var wg sync.WaitGroup
				sem := make(chan struct{}, 20)
				for range tc.clients {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						halfClosed(t, srv.Listener.Addr().String(), tc.request)
					}()
				}
				wg.Wait()
				if n, c := calls.Load(), cancelled.Load(); n != int64(tc.clients) || c != n {
					t.Fatalf("%d of %d key calls saw the client leave, want all %d: the decision must be made for a cancelled request", c, n, tc.clients)
				}
				// Redis decides every request (the health check below shows no
				// fail mode acted), so exactly the limit gets through: fewer
				// would mean the key was never read.
				if got := reached.Load(); got != tc.limit {
					t.Errorf("%d half-closed requests reached the handler, want %d, the limit", got, tc.limit)
				}
				if h := l.Health(); h.Status != "healthy" || h.Rules[0].FailOpenAdmissions+h.Rules[0].FailLocalAdmissions != 0 {
					t.Errorf("health %+v: clients leaving are not a backend failure", h)
				}
			})
		}
	}
}

// halfClosed sends one raw request and closes its writing half at once.
func halfClosed(t *testing.T, addr, request string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Error(err)
		return
	}
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = http.ReadResponse(bufio.NewReader(c), nil)
}

// Frozen with SIGSTOP until the breaker opens, then thawed: the limiter
// comes back by its own probes, with no request, about a second after
// Redis answers (issue 12.3); and likewise under traffic. How soon is a
// frozen server's timing, asserted in CI (citest), which has a machine to
// itself; by default it must come back at all. The timeout is the
// confirming probe's budget, so the probes run as at the defaults, and
// long enough that the decisions after the recovery (FailClosed, which a
// timeout refuses) are answered on a loaded machine.
func TestRedisFrozenRecoversWithoutTraffic(t *testing.T) {
	inst := redistest.Server(t)
	l := MustNew([]Rule{{Name: "otp", Key: RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: SlidingLog}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailClosed), WithTimeout(confirmBudget), WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(okHandler)
	ctx := context.Background()
	for _, traffic := range []bool{false, true} {
		inst.Freeze(t)
		for l.Health().Status == "healthy" {
			fromAddr(h, "192.0.2.250")
		}
		if got := l.Health().Reason; got != "timeout" {
			t.Errorf("frozen: reason %q, want timeout", got)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if traffic {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						l.Decide(ctx, Input{Rule: "otp", Key: "traffic"})
						time.Sleep(5 * time.Millisecond) // real: traffic paced against a live Redis
					}
				}
			}()
		}
		time.Sleep(1500 * time.Millisecond) // probes fail meanwhile
		inst.Thaw(t)
		thawed := time.Now()
		if !eventually(func() bool { return l.Health().Status == "healthy" }) {
			t.Fatalf("traffic %v: still degraded 10s after Redis thawed", traffic)
		}
		took := time.Since(thawed)
		close(stop)
		wg.Wait()
		t.Logf("traffic %v: healthy %v after SIGCONT", traffic, took)
		if took > 3*time.Second && citest.Enabled() {
			t.Errorf("traffic %v: healthy only %v after Redis answered again, want about a second", traffic, took)
		}
		key := "enforced-" + itoa(len(itoa(int(took)))) + map[bool]string{false: "idle", true: "busy"}[traffic]
		var got []bool
		for range 4 {
			d, err := l.Decide(ctx, Input{Rule: "otp", Key: key})
			if err != nil {
				t.Fatalf("after recovery: %v", err)
			}
			got = append(got, d.Allowed)
		}
		if want := []bool{true, true, true, false}; !slices.Equal(got, want) {
			t.Errorf("traffic %v: after recovery %v, want %v (enforced by Redis)", traffic, got, want)
		}
	}
}

// instance is one of several limiters sharing a Redis, each with its own
// client (and deny cache), as separate processes would.
type instance struct {
	l        *Limiter
	mu       sync.Mutex
	admitted []span // when each admitted decision was asked and answered
}

// span brackets the moment a decision was made: the backend decided at
// some instant between before and after.
type span struct{ before, after time.Time }

// in reports whether the decision certainly fell in (from, to].
func (s span) in(from, to time.Time) bool { return s.before.After(from) && !s.after.After(to) }

// edgeRule is what the edge tests limit: 30 per 2 s, exactly, on one key.
var edgeRule = Rule{Name: "edge", Limit: 30, Period: 2 * time.Second, Algorithm: SlidingLog}

func newInstances(t *testing.T, addrs []string, prefix string) []*instance {
	var out []*instance
	for _, addr := range addrs {
		// 250ms: a loaded CI machine does not trip the breakers of a
		// healthy Redis, and a frozen one still opens them within 1.25 s.
		l := MustNew([]Rule{edgeRule}, WithBackend(storeAt(t, addr, prefix)), WithTimeout(250*time.Millisecond),
			WithInstances(len(addrs)), WithLogger(slog.New(slog.DiscardHandler)))
		t.Cleanup(func() { l.Close() })
		out = append(out, &instance{l: l})
	}
	return out
}

// drive sends each instance one decision on the key every 10 ms until stop
// is closed, recording when each admission was answered.
func drive(insts []*instance, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, in := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				before := time.Now()
				d, err := in.l.Decide(context.Background(), Input{Rule: edgeRule.Name, Key: "one-key"})
				if err == nil && d.Allowed {
					in.mu.Lock()
					in.admitted = append(in.admitted, span{before, time.Now()})
					in.mu.Unlock()
				}
			}
		}()
	}
	return &wg
}

// spans returns every instance's admissions.
func spans(insts []*instance) []span {
	var all []span
	for _, in := range insts {
		in.mu.Lock()
		all = append(all, in.admitted...)
		in.mu.Unlock()
	}
	return all
}

// windowMax is the most admissions of all instances certainly made in one
// window (e-p, e] of length p, over every e, or over those whose window
// contains at if at is not zero. Counting only the decisions certainly in
// the window keeps the test from blaming the limiter for the time between
// its answer and the test's clock reading.
func windowMax(insts []*instance, p time.Duration, at time.Time) int {
	all := spans(insts)
	most := 0
	for _, e := range all {
		end := e.after
		if !at.IsZero() && (end.Before(at) || !end.Add(-p).Before(at)) {
			continue
		}
		n := 0
		for _, s := range all {
			if s.in(end.Add(-p), end) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// windowMaxEnding is windowMax over the windows closed by a decision asked
// after at: the windows across at that the backend decided last.
func windowMaxEnding(insts []*instance, p time.Duration, at time.Time) int {
	all := spans(insts)
	most := 0
	for _, e := range all {
		if !e.before.After(at) || !e.before.Before(at.Add(p)) {
			continue
		}
		n := 0
		for _, s := range all {
			if s.in(e.after.Add(-p), e.after) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// Three instances at 300 decisions a second on one key limited to 30 per
// 2 s, and Redis frozen for 4 s: inside the outage each admits its third;
// the windows that span the outage's start and end admit at most the
// limit too, because the local stores start from Redis's last word and
// Redis is charged with what they admitted before it decides again (issue
// 12.6).
func TestFailLocalBoundAcrossAFrozenRedis(t *testing.T) {
	inst := redistest.Server(t)
	prefix := redistest.KeyPrefix(t)
	insts := newInstances(t, []string{inst.Addr, inst.Addr, inst.Addr}, prefix)
	stop := make(chan struct{})
	wg := drive(insts, stop)
	time.Sleep(2500 * time.Millisecond) // real: the instances decide on a live Redis first
	inst.Freeze(t)
	frozen := time.Now()
	// Redis, frozen: long enough that the key's deny-cache entry (up to
	// the 2 s period) runs out and five timeouts, confirmed by a probe,
	// open the breakers.
	time.Sleep(4 * time.Second)
	inst.Thaw(t)
	thawed := time.Now()
	time.Sleep(3 * time.Second) // real: the instances decide on the thawed Redis
	close(stop)
	wg.Wait()
	for i, in := range insts {
		if h := in.l.Health(); h.DegradedTotal != 1 || h.Rules[0].FailLocalAdmissions == 0 {
			t.Errorf("instance %d: %+v, want one outage decided locally", i, h)
		}
	}
	p := edgeRule.Period
	all, start, end := windowMax(insts, p, time.Time{}), windowMax(insts, p, frozen), windowMax(insts, p, thawed)
	t.Logf("most admitted in 2 s: %d in any window, %d spanning the freeze, %d spanning the thaw", all, start, end)
	if all > int(edgeRule.Limit) {
		t.Errorf("%d admitted in one 2 s window (start %d, end %d), want at most %d", all, start, end, edgeRule.Limit)
	}
}

// One instance of three cut off from Redis for 3 s while the others keep
// deciding there. Inside the partition the cut instance adds its share to
// what Redis admits (the others cannot know of it): at most limit + share
// in any window, the documented bound of a partition. At its end Redis is
// charged with what the cut instance admitted before anyone decides
// there knowing nothing of it, so every window that a decision after the
// recovery closes holds at most the limit (issue 12.6).
func TestFailLocalBoundAcrossAPartition(t *testing.T) {
	inst := redistest.Server(t)
	proxy := redistest.NewProxy(t, inst.Addr)
	prefix := redistest.KeyPrefix(t)
	insts := newInstances(t, []string{inst.Addr, inst.Addr, proxy.Addr}, prefix)
	stop := make(chan struct{})
	wg := drive(insts, stop)
	time.Sleep(2500 * time.Millisecond) // real: the instances decide on a live Redis first
	proxy.Partition()
	time.Sleep(3 * time.Second) // real: the partition lasts 3 s of the proxy's time
	proxy.Heal()
	cut := insts[2].l
	if !eventually(func() bool { return cut.Health().Status == "healthy" }) {
		t.Fatal("the cut instance never recovered")
	}
	recovered := time.Now()
	time.Sleep(2500 * time.Millisecond) // real: decisions on the healed Redis
	close(stop)
	wg.Wait()
	if h := cut.Health(); h.DegradedTotal != 1 || h.Rules[0].FailLocalAdmissions == 0 {
		t.Errorf("the cut instance: %+v, want one outage decided locally", h)
	}
	for i, in := range insts[:2] {
		if h := in.l.Health(); h.DegradedTotal != 0 {
			t.Errorf("instance %d, never cut: %+v", i, h)
		}
	}
	p, limit := edgeRule.Period, int(edgeRule.Limit)
	share := limit / len(insts)
	all, end := windowMax(insts, p, time.Time{}), windowMaxEnding(insts, p, recovered)
	t.Logf("most admitted in 2 s: %d in any window, %d in windows closed after the recovery", all, end)
	if all > limit+share {
		t.Errorf("%d admitted in one 2 s window, want at most %d (the limit, plus the cut instance's share)", all, limit+share)
	}
	if end > limit {
		t.Errorf("%d admitted in a 2 s window closed by a decision after the recovery, want at most %d", end, limit)
	}
}

// A process too busy to read Redis's replies in time (16 goroutines whose
// key function burns 2ms of CPU per request, on 2 CPUs) on a healthy Redis:
// Redis was not slow, so the breaker never moves, a spent key (refused
// from the deny cache) is never admitted, and no fresh key is decided by
// the fail mode (issue 12.9; before: 1–2 transitions in some runs, and
// 40–1,100 fresh keys per 3 s failing open, their replies unread). Then
// Redis freezes under the same flood: a frozen Redis on a starved process
// still opens the breaker, and the spent key stays refused through the
// outage. TestStarvedTimeoutsAreConfirmed... pins the limiter's part
// hermetically.
func TestStarvedCPUIsNotABackendFailure(t *testing.T) {
	citest.Only(t)
	inst := redistest.Server(t)
	var transitions atomic.Int64
	errs := &errTally{}
	burn := func(r *http.Request) (string, error) {
		deadline := time.Now().Add(2 * time.Millisecond)
		for time.Now().Before(deadline) {
		}
		return r.Header.Get("X-Shop"), nil
	}
	l := MustNew([]Rule{{Name: "shop", Key: burn, Limit: 3, Period: time.Minute}},
		WithBackend(redisStore(t, inst)), WithFailMode(FailOpen), WithLogger(slog.New(slog.DiscardHandler)),
		onDegraded(func(DegradedEvent) { transitions.Add(1) }), WithObserver(errs))
	defer l.Close()
	h := l.Handler(okHandler)
	shop := func(name string) int {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", name)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for range 4 {
		shop("spent")
	}
	var spentAdmitted, fresh, n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n.Add(1)
				if g%2 == 0 {
					if shop("spent") == 200 {
						spentAdmitted.Add(1)
					}
					continue
				}
				shop("shop-" + itoa(g*1000000+i)) // every one a Redis round trip
				fresh.Add(1)
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	time.Sleep(2 * time.Second) // real: the CPU flood against a live Redis
	hl := l.Health()
	t.Logf("healthy Redis: %d requests from 16 CPU-burning goroutines, %d of them fresh shops; %d failed open; backend errors: %v",
		n.Load(), fresh.Load(), hl.Rules[0].FailOpenAdmissions, errs.get())
	if got := spentAdmitted.Load(); got != 0 {
		t.Errorf("a spent shop was admitted %d times while Redis was healthy", got)
	}
	if got := transitions.Load(); got != 0 {
		t.Errorf("%d breaker transitions with Redis healthy", got)
	}
	if got := hl.Rules[0].FailOpenAdmissions; got != 0 {
		t.Errorf("%d fresh shops failed open with Redis healthy", got)
	}

	inst.Freeze(t)
	defer inst.Thaw(t)
	frozen := time.Now()
	for l.Health().Status != "degraded" {
		if time.Since(frozen) > 20*time.Second {
			t.Fatalf("a frozen Redis, under the same flood: not degraded after 20s (backend errors: %v)", errs.get())
		}
		time.Sleep(10 * time.Millisecond) // real: polling for the frozen Redis to be blamed
	}
	t.Logf("frozen Redis: degraded %v after the freeze", time.Since(frozen).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // the spent shop, failing open for the others
	close(stop)
	wg.Wait()
	if got := spentAdmitted.Load(); got != 0 {
		t.Errorf("a spent shop was admitted %d times (Redis frozen, the breaker open)", got)
	}
	if got := l.Health().Rules[0].FailOpenAdmissions; got == 0 {
		t.Error("no fresh shop failed open while Redis was frozen")
	}
}

// errTally counts backend errors by their text, minus durations.
type errTally struct {
	NopObserver
	mu sync.Mutex
	m  map[string]int
}

func (e *errTally) ObserveBackend(_ time.Duration, err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	e.m[errShape.ReplaceAllString(err.Error(), "…")]++
}

// errShape matches what differs between errors of one kind: quoted keys
// and durations.
var errShape = regexp.MustCompile(`"[^"]*"|[0-9.]+(ms|µs|s)\b`)

func (e *errTally) get() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.m)
}
