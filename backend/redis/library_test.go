package redis

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestServersWithoutFunctionsGetEVALSHA decides on servers that will not
// run the library: one without the FCALL command (as before Redis 7, or a
// compatible server without functions), and one whose user may call
// scripts but not functions. The first decision is answered by EVAL, and
// every later one is one EVALSHA; the Store says so once, at Warn.
func TestServersWithoutFunctionsGetEVALSHA(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) *redis.Client
	}{
		{"no FCALL", func(t *testing.T) *redis.Client {
			return defaultClient(t, redistest.ServerWith(t, `rename-command FCALL ""`).Addr)
		}},
		{"no FUNCTION", func(t *testing.T) *redis.Client {
			return defaultClient(t, redistest.ServerWith(t, `rename-command FUNCTION ""`).Addr)
		}},
		{"user without functions", func(t *testing.T) *redis.Client {
			srv := redistest.Server(t)
			admin := srv.Client(t)
			if err := admin.Do(context.Background(), "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-fcall", "-function").Err(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
			t.Cleanup(func() { c.Close() })
			return c
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := c.client(t)
			count := countCommands(client)
			logs := &records{}
			s := New(client, WithLogger(slog.New(logs)), WithDenyCache(0))
			for i := range 4 {
				count.reset()
				res := decide(t, s, day("k", 1))
				if i == 0 { // a refused load comes once the call is answered
					waitFor(t, "the refusal", func() bool { return len(storeLines(logs, "refused functions")) > 0 })
				}
				if got, want := res[0].Remaining, backend.MaxLimit-1-int64(i); !res[0].Allowed || got != want {
					t.Fatalf("decision %d: %+v, want allowed with %d remaining", i+1, res[0], want)
				}
				sent := strings.Join(count.sent(), ",") // the first: after the connection's handshake
				switch {
				case i == 0 && !(strings.HasPrefix(sent, "fcall,") && strings.Contains(sent, ",eval")):
					t.Errorf("first decision sent %s, want fcall, then eval", sent)
				case i > 0 && sent != "evalsha":
					t.Errorf("decision %d sent %s, want evalsha alone", i+1, sent)
				}
			}
			if lines := storeLines(logs, "refused functions"); len(lines) != 1 {
				t.Errorf("%d lines saying functions were refused, want 1: %v", len(lines), logs.get())
			}
		})
	}
}

// TestLibraryIsLoadedOnceUnderConcurrentCallers empties a server's library
// and script cache under 50 concurrent callers: each decision is applied
// once (by EVAL, or by the function once it is back), the library is
// loaded again, and the next decision is one FCALL.
func TestLibraryIsLoadedOnceUnderConcurrentCallers(t *testing.T) {
	srv := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	count := countCommands(client)
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1))
	if err := flushScripts(context.Background(), srv.Client(t)); err != nil {
		t.Fatal(err)
	}
	const n = 50
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			_, err := s.Decide(context.Background(), []backend.Request{day("k", 1)})
			errs <- err
		}()
	}
	close(start)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, want := stored(t, s, "k"), int64(n+1); got != want {
		t.Errorf("units stored = %d, want %d: each decision once", got, want)
	}
	waitForLibrary(t, srv.Client(t))
	loads := 0
	for _, name := range count.sent() {
		if name == "function" {
			loads++
		}
	}
	if loads == 0 {
		t.Errorf("no FUNCTION LOAD after %d callers found no library", n)
	}
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(count.sent(), ","); got != "fcall" {
		t.Errorf("the next decision sent %s, want fcall: the library is back", got)
	}
}

// TestOnlyARefusedCallIsSentAgain: the errors that re-send a call as EVAL
// are those of a call Redis did not run. An error a script raised after it
// wrote (which names no refused command) is the call's answer.
func TestOnlyARefusedCallIsSentAgain(t *testing.T) {
	for _, c := range []struct {
		err     string
		refused bool
	}{
		{"ERR unknown command 'fcall', with args beginning with: 'ceiling_x_batch' '1'", true},
		{"ERR unknown command `FUNCTION`, with args beginning with: `LOAD`", true},
		{"NOPERM User limiter has no permissions to run the 'fcall' command", true},
		{"ERR Error registering functions: user_function:2: attempt to index nil", true},
		{"ERR user_script:12: Unknown Redis command called from script script: ceiling_x_batch", false},
		{"ERR user_function:12: Unknown Redis command called from script", false},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", false},
		{"ERR unknown command 'time', with args beginning with:", false},
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
	} {
		if got := refusesFunctions(redisError(c.err)); got != c.refused {
			t.Errorf("refusesFunctions(%q) = %v, want %v", c.err, got, c.refused)
		}
	}
}

// TestALostLibraryLoadReplyHoldsUpNoCall: the reply of the FUNCTION LOAD
// that follows a call's EVAL is lost, the connection left open. The call,
// which has no deadline of its own and sends its own round trip, returns
// its decision at once, applied once; the load gives up after loadTimeout
// and is logged; and the next decision finds the library Redis did load.
func TestALostLibraryLoadReplyHoldsUpNoCall(t *testing.T) {
	srv := redistest.Server(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	count := countCommands(client)
	logs := &records{}
	s := New(client, WithLogger(slog.New(logs)), WithDenyCache(0))
	proxy.LoseReplyLate("register_function") // only the library's source holds it
	start := time.Now()
	res := decide(t, s, day("k", 1))
	if took := time.Since(start); took > loadTimeout/2 {
		t.Errorf("the decision took %v, want it back before the load gives up (%v)", took, loadTimeout)
	}
	if !res[0].Allowed || stored(t, s, "k") != 1 {
		t.Errorf("decision %+v, %d units stored: want admitted, applied once", res[0], stored(t, s, "k"))
	}
	waitFor(t, "the failed load's line", func() bool { return len(storeLines(logs, "loading the function library")) == 1 })
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(scriptNames(count.sent()), ","); got != "fcall" {
		t.Errorf("the next decision sent %s, want fcall: Redis ran the load whose reply was lost", got)
	}
}

// TestAReadOnlyReplicaIsNotSentTheLibrary: a replica that lacks the
// library refuses the EVAL that follows with READONLY; the Store loads
// nothing there (go-redis would resend a refused load until the call's
// deadline), so the call fails at once with the replica's own error.
func TestAReadOnlyReplicaIsNotSentTheLibrary(t *testing.T) {
	client := defaultClient(t, replicaServer(t).Addr)
	count := countCommands(client)
	s := New(client, WithDenyCache(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Decide(ctx, []backend.Request{day("k", 1)})
	if !errors.Is(err, backend.ErrReadOnly) {
		t.Fatalf("err = %v, want ErrReadOnly", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the refusal took %v, want it at once", took)
	}
	if slices.Contains(count.sent(), "function") {
		t.Errorf("commands %v: a FUNCTION LOAD sent to a replica", count.sent())
	}
}

// TestAFullRedisStillAnswersWhatWritesNothing: Redis refuses a function
// whole when it is out of memory (maxmemory, noeviction), where a script
// runs until its first write. On a full Redis a peek, a request over its
// limit, a peek of two keys and the release of a lease (which frees
// memory) are answered through the functions as through EVALSHA.
func TestAFullRedisStillAnswersWhatWritesNothing(t *testing.T) {
	ctx := context.Background()
	lease := func(id, cost int64) backend.Request {
		return backend.Request{Key: "c", Algorithm: backend.Concurrency, Limit: 10, Period: time.Hour, Cost: cost, Lease: id}
	}
	tight := backend.Request{Key: "t", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	for _, scripts := range []bool{false, true} {
		t.Run(map[bool]string{false: "FCALL", true: "EVALSHA"}[scripts], func(t *testing.T) {
			srv := redistest.Server(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
			t.Cleanup(func() { client.Close() })
			s := New(client, WithDenyCache(0))
			if scripts {
				s.scriptsUntil.Store(math.MaxInt64)
			}
			decide(t, s, lease(1, 1))
			decide(t, s, tight) // the window is full now
			decide(t, s, day("k", 1))
			srv.Fill(t)
			for _, c := range []struct {
				what string
				reqs []backend.Request
			}{
				{"peek", []backend.Request{day("k", 0)}},
				{"rejection", []backend.Request{tight}},
				{"release of a lease", []backend.Request{lease(1, -1)}},
				{"peek of two keys", []backend.Request{day("k", 0), day("k2", 0)}},
			} {
				if _, err := s.Decide(ctx, c.reqs); err != nil {
					t.Errorf("%s on a full Redis: %v; want it answered (it writes nothing, or frees memory)", c.what, err)
				}
			}
		})
	}
}

// TestTooFewReplicasStillAnswerAPeek: the same with min-replicas-to-write
// unmet (NOREPLICAS), which Redis also checks before a function runs.
func TestTooFewReplicasStillAnswerAPeek(t *testing.T) {
	c := redistest.Server(t).Client(t)
	ctx := context.Background()
	s := New(c, WithDenyCache(0))
	decide(t, s, day("k", 1))
	if err := c.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(ctx, []backend.Request{day("k", 0)}); err != nil {
		t.Errorf("a peek with too few replicas: %v; want it answered (it writes nothing)", err)
	}
}

// TestAnAnsweredDecisionIsNotHeldByTheLibraryLoad: after a FUNCTION FLUSH
// a decision's EVAL runs and answers, and the FUNCTION LOAD that follows is
// slow to answer. The decision has its answer by its deadline: the load
// comes after the calls are answered.
func TestAnAnsweredDecisionIsNotHeldByTheLibraryLoad(t *testing.T) {
	srv := redistest.Server(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s := New(defaultClient(t, proxy.Addr), WithDenyCache(0))
	decide(t, s, day("warm", 1)) // the library is loaded
	if err := srv.Client(t).FunctionFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	lose := proxy.LoseReplyLate("register_function") // the FUNCTION LOAD runs; its reply is late
	defer lose()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := s.Decide(ctx, []backend.Request{day("k", 1)})
	lose()
	if err != nil || !res[0].Allowed {
		t.Errorf("a decision answered by EVAL, then a slow load: %v, %+v; want its answer", err, res)
	}
	if got := stored(t, s, "k"); got != 1 {
		t.Errorf("stored %d, want 1 (applied once)", got)
	}
}

// TestAUserWithoutEVALIsDecidedAfterALostLibrary: a user allowed FCALL and
// FUNCTION but not EVAL or EVALSHA (an ACL that bans ad-hoc scripts). On a
// Redis without the library, and again after a FUNCTION FLUSH, the Store
// loads the library and calls the function again in the same decision,
// rather than failing it with the EVAL's NOPERM.
func TestAUserWithoutEVALIsDecidedAfterALostLibrary(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Server(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-eval", "-evalsha", "-script").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1)) // a Redis that never had the library
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decide(t, s, day("k", 1))
	if got := stored(t, s, "k"); got != 2 {
		t.Errorf("stored %d, want 2: each decision once", got)
	}
}

// TestFunctionsAreCalledAgainAfterARefusal: a user whose FCALL is revoked
// for a moment. The refusal sends EVALSHA for scriptsFor; once it has
// passed and FCALL is allowed again, a decision is one FCALL again.
func TestFunctionsAreCalledAgainAfterARefusal(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Server(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	count := countCommands(client)
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1))
	waitForLibrary(t, admin)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "-fcall").Err(); err != nil {
		t.Fatal(err)
	}
	decide(t, s, day("k", 1)) // FCALL refused: EVAL, then EVALSHA for a while
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(scriptNames(count.sent()), ","); got != "evalsha" {
		t.Errorf("a decision right after the refusal sent %s, want evalsha", got)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "+fcall").Err(); err != nil {
		t.Fatal(err)
	}
	s.scriptsUntil.Store(time.Now().Add(-time.Second).UnixNano()) // scriptsFor has passed
	for i := range 2 {
		count.reset()
		decide(t, s, day("k", 1))
		if got := strings.Join(scriptNames(count.sent()), ","); got != "fcall" {
			t.Errorf("decision %d once FCALL is allowed again sent %s, want fcall", i+1, got)
		}
	}
	if got := stored(t, s, "k"); got != 5 {
		t.Errorf("stored %d, want 5: each decision once", got)
	}
}

// TestAUserRefusedFUNCTIONKeepsCallingTheFunction: a user allowed FCALL
// and EVAL but not FUNCTION, whose library another instance loads. After a
// FUNCTION FLUSH its decisions are answered by EVAL, its refused load is
// logged and not sent again at once, and it keeps calling the function:
// once the other instance has loaded the library again, one FCALL answers.
func TestAUserRefusedFUNCTIONKeepsCallingTheFunction(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Server(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	loader := New(admin, WithDenyCache(0))
	decide(t, loader, day("warm", 1))
	waitForLibrary(t, admin)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	count := countCommands(client)
	logs := &records{}
	s := New(client, WithLogger(slog.New(logs)), WithDenyCache(0))
	decide(t, s, day("k", 1))
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decide(t, s, day("k", 1))
	waitFor(t, "the refused load's line", func() bool { return len(storeLines(logs, "loading the function library")) == 1 })
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(scriptNames(count.sent()), ","); got != "fcall,eval" {
		t.Errorf("a decision while the library is missing sent %s, want fcall, eval: no load again at once", got)
	}
	decide(t, loader, day("warm", 1))
	waitForLibrary(t, admin)
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(scriptNames(count.sent()), ","); got != "fcall" {
		t.Errorf("a decision once the library is back sent %s, want fcall", got)
	}
	if got := stored(t, s, "k"); got != 4 {
		t.Errorf("stored %d, want 4: each decision once", got)
	}
}

// TestACallOverEveryMasterLoadsEachOfThem: every master lost its library,
// and one call spans keys on each: each answers with its EVAL, and every
// master gets the library back.
func TestACallOverEveryMasterLoadsEachOfThem(t *testing.T) {
	client := redistest.Cluster(t).Client(t)
	ctx := context.Background()
	s := New(client, WithPrefix("p"), WithDenyCache(0))
	var reqs []backend.Request
	for _, k := range keysOnMasters(t, client) { // under the prefix "p"

		reqs = append(reqs, day(k, 1))
	}
	decide(t, s, reqs...)
	if err := client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FunctionFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	decide(t, s, reqs...)
	waitForLibraryOnMasters(t, client)
}
