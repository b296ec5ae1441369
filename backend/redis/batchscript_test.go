package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// loneRequests are n calls of one request each, on keys k0..k(n-1) that
// never reach their limits: they cycle through a rolling window, GCRA and
// a sliding log, and through two limits and two periods, so that a shared
// script holds several rules and a decision read by another's rule
// answers with the wrong remaining count.
func loneRequests(n int) [][]backend.Request {
	algs := []backend.Algorithm{backend.RollingWindow, backend.GCRA, backend.SlidingLog}
	calls := make([][]backend.Request, n)
	for i := range calls {
		calls[i] = []backend.Request{{
			Key:       "k" + strconv.Itoa(i),
			Algorithm: algs[i%3],
			Limit:     int64(1000 + 10*(i%4)),
			Period:    time.Duration(1+i%2) * time.Hour,
			Cost:      1,
		}}
	}
	return calls
}

// queueBehindHeldLane holds the only lane of s (a Store of one round trip
// in flight on a client through proxy) with a decision of its own, starts
// every call of calls while it is held, waits until all of them are
// queued, and returns a function that lets the held round trip end and
// returns each call's outcome.
func queueBehindHeldLane(t *testing.T, s *Store, proxy *redistest.Proxy, trips *tripCounter, calls [][]backend.Request) func() ([][]backend.Result, []error) {
	t.Helper()
	before := len(trips.get())
	first := holdTheLane(t, s, proxy, func() bool { return len(trips.get()) == before+1 })
	results := make([][]backend.Result, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, reqs := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			results[i], errs[i] = s.Decide(ctx, reqs)
		})
	}
	waitFor(t, "queued decisions", func() bool { return queued(s) == len(calls) })
	return func() ([][]backend.Result, []error) {
		proxy.Resume()
		wg.Wait()
		if err := <-first; err != nil {
			t.Fatalf("the decision that held the lane: %v", err)
		}
		return results, errs
	}
}

// TestLoneDecisionsShareOneScript queues 20 calls of one request each (a
// rolling window, GCRA or a sliding log, of twelve rules) behind a round
// trip in flight: they go out as one command, batch.lua deciding all 20 in
// one script run, and each answers as its own call would.
func TestLoneDecisionsShareOneScript(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Shared(t).Addr)
	client := defaultClient(t, proxy.Addr)
	trips := &tripCounter{}
	client.AddHook(trips)
	count := countCommands(client)
	s := oneLane(New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	decide(t, s, day("warm", 1))

	if err := batchScript.Load(context.Background(), redistest.Shared(t).Client(t)).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	calls := loneRequests(n)
	calls = append(calls, calls[0], calls[1]) // a key twice: the second sees the first
	count.reset()
	results, errs := queueBehindHeldLane(t, s, proxy, trips, calls)()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := trips.get(); got[len(got)-1] != 1 {
		t.Errorf("scripts per round trip = %v, want the queued decisions in one", got)
	}
	if got, want := count.sent(), []string{"fcall", "fcall"}; !slices.Equal(got, want) {
		t.Errorf("commands sent = %v, want %v (the held decision's, then one for the queued)", got, want)
	}
	for i, res := range results {
		limit := res[0].Limit
		want := limit - 1
		if i < 2 || i >= n {
			// Two calls on the key, in either order: one sees the other.
			var j int
			if i < 2 {
				j = i + n
			} else {
				j = i - n
			}
			want = 2*limit - 3 - results[j][0].Remaining
		}
		if !res[0].Allowed || limit != calls[i][0].Limit || res[0].Remaining != want || (want != limit-1 && want != limit-2) {
			t.Errorf("call %d (%v): %+v, want admitted with %d remaining", i, calls[i][0].Algorithm, res[0], want)
		}
	}
	// Each key holds what its calls consumed.
	for i := range n {
		want := calls[i][0].Limit - 1
		if i < 2 {
			want--
		}
		peek := calls[i][0]
		peek.Cost = 0
		if got := decide(t, s, peek)[0].Remaining; got != want {
			t.Errorf("key %s after the batch: remaining %d, want %d", peek.Key, got, want)
		}
	}
}

// TestBatchedDecisionFailsAlone: a decision of a shared script whose key
// holds a value of another type fails with Redis's error, and every other
// decision of the batch stands.
func TestBatchedDecisionFailsAlone(t *testing.T) {
	srv := redistest.Shared(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	client := defaultClient(t, proxy.Addr)
	trips := &tripCounter{}
	client.AddHook(trips)
	prefix := redistest.KeyPrefix(t)
	s := oneLane(New(client, WithPrefix(prefix), WithDenyCache(0)))
	decide(t, s, day("warm", 1))
	calls := loneRequests(6)
	for _, i := range []int{2, 3, 4} { // a sliding log, a rolling window and a GCRA key
		if err := srv.Client(t).LPush(context.Background(), prefix+":"+calls[i][0].Key, "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	results, errs := queueBehindHeldLane(t, s, proxy, trips, calls)()
	for i := range calls {
		switch {
		case i >= 2 && i <= 4:
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
				t.Errorf("call %d on a list: err = %v, want WRONGTYPE", i, errs[i])
			}
		case errs[i] != nil:
			t.Errorf("call %d: %v, want its own answer", i, errs[i])
		case !results[i][0].Allowed || results[i][0].Remaining != calls[i][0].Limit-1:
			t.Errorf("call %d: %+v, want admitted with %d remaining", i, results[i][0], calls[i][0].Limit-1)
		}
	}
}

// TestBatchedDecisionsNameTheirKind: the decisions of a shared script on a
// full Redis and on a replica each fail with the kind of the failure.
func TestBatchedDecisionsNameTheirKind(t *testing.T) {
	for _, tt := range []struct {
		name   string
		server func(t *testing.T) *redistest.Instance
		kind   error
	}{
		{"out of memory", fullServer, backend.ErrOutOfMemory},
		{"read-only replica", replicaServer, backend.ErrReadOnly},
	} {
		t.Run(tt.name, func(t *testing.T) {
			proxy := redistest.NewProxy(t, tt.server(t).Addr)
			client := defaultClient(t, proxy.Addr)
			trips := &tripCounter{}
			client.AddHook(trips)
			s := oneLane(New(client, WithDenyCache(0)))
			// The lane is held by a decision that fails as well.
			before := len(trips.get())
			proxy.Stall()
			first := make(chan error, 1)
			go func() {
				_, err := s.Decide(context.Background(), []backend.Request{day("k", 1)})
				first <- err
			}()
			waitFor(t, "the first round trip", func() bool { return len(trips.get()) > before })
			calls := loneRequests(6)
			errs := make([]error, len(calls))
			var wg sync.WaitGroup
			for i, reqs := range calls {
				wg.Go(func() { _, errs[i] = s.Decide(context.Background(), reqs) })
			}
			waitFor(t, "queued decisions", func() bool { return queued(s) == len(calls) })
			proxy.Resume()
			wg.Wait()
			<-first
			for i, err := range errs {
				if !errors.Is(err, tt.kind) {
					t.Errorf("call %d: err = %v, want it to wrap %v", i, err, tt.kind)
				}
			}
		})
	}
}

// TestScriptCacheFlushedUnderASharedScript empties the script cache and
// the library while lone decisions wait to share a script: the shared
// script's FCALL finds no function, and the store sends it again as one
// EVAL, each decision decided once, then loads the library.
func TestScriptCacheFlushedUnderASharedScript(t *testing.T) {
	srv := redistest.Shared(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	client := defaultClient(t, proxy.Addr)
	count := countCommands(client)
	trips := &tripCounter{}
	client.AddHook(trips)
	s := oneLane(New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0)))
	ctx := context.Background()
	decide(t, s, day("warm", 1))
	calls := loneRequests(10)
	release := queueBehindHeldLane(t, s, proxy, trips, calls)
	if err := flushScripts(ctx, srv.Client(t)); err != nil {
		t.Fatal(err)
	}
	count.reset()
	results, errs := release()
	if got, want := count.sent()[:min(2, len(count.sent()))], []string{"fcall", "eval"}; !slices.Equal(got, want) {
		t.Errorf("commands after the flush %v, want %v first: the shared script, then its EVAL", count.sent(), want)
	}
	for i := range calls {
		if errs[i] != nil || !results[i][0].Allowed || results[i][0].Remaining != calls[i][0].Limit-1 {
			t.Errorf("call %d: %+v, %v: want admitted once, %d remaining", i, results[i], errs[i], calls[i][0].Limit-1)
		}
	}
}

// TestSharedScriptsKeepToASlot: on Cluster, lone decisions share a script
// only with the consecutive ones of their own hash slot (a script runs on
// one slot's keys).
func TestSharedScriptsKeepToASlot(t *testing.T) {
	ctx := context.Background()
	mk := func(s *Store, key string, alg backend.Algorithm) *op {
		reqs := []backend.Request{{Key: key, Algorithm: alg, Limit: 10, Period: time.Second, Cost: 1}}
		return &op{script: batchScript, key: s.prefix + key, lone: loneCall{req: reqs[0], now: -1}}
	}
	shape := func(trips []trip) string {
		var parts []string
		for _, t := range trips {
			if t.shared {
				parts = append(parts, fmt.Sprintf("shared(%d)", len(t.ops)))
			} else {
				parts = append(parts, "own")
			}
		}
		return strings.Join(parts, " ")
	}
	cluster := New(redistest.SharedCluster(t).Client(t))
	x1 := func() *op { return mk(cluster, "{x}1", backend.RollingWindow) }
	x2 := func() *op { return mk(cluster, "{x}2", backend.GCRA) }
	y1 := func() *op { return mk(cluster, "{y}1", backend.SlidingLog) }
	multi := func() *op {
		o := cluster.scriptOp(ctx, decideScript, []string{"{x}3", "{x}4"}, nil)
		return &o
	}
	for _, c := range []struct {
		ops  []*op
		want string
	}{
		{[]*op{x1(), x2(), y1()}, "shared(2) own"},
		{[]*op{x1(), y1(), x2()}, "own own own"},
		{[]*op{x1(), x2(), multi(), x1(), x2()}, "shared(2) own shared(2)"},
	} {
		if got := shape(cluster.trips(ctx, c.ops, nil)); got != c.want {
			t.Errorf("trips on Cluster = %s, want %s", got, c.want)
		}
	}
	single := New(redistest.Shared(t).Client(t))
	three := func() []*op {
		return []*op{mk(single, "{x}1", backend.RollingWindow), mk(single, "{y}1", backend.GCRA), mk(single, "{z}1", backend.SlidingLog)}
	}
	if got, want := shape(single.trips(ctx, three(), nil)), "shared(3)"; got != want {
		t.Errorf("trips on one server = %s, want %s", got, want)
	}
}
