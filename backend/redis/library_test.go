package redis

import (
	"context"
	"errors"
	"log/slog"
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
				if got, want := res[0].Remaining, backend.MaxLimit-1-int64(i); !res[0].Allowed || got != want {
					t.Fatalf("decision %d: %+v, want allowed with %d remaining", i+1, res[0], want)
				}
				sent := strings.Join(count.names, ",") // the first: after the connection's handshake
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
	loads := 0
	for _, name := range count.names {
		if name == "function" {
			loads++
		}
	}
	if loads == 0 {
		t.Errorf("no FUNCTION LOAD after %d callers found no library", n)
	}
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(count.names, ","); got != "fcall" {
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

// TestALostLibraryLoadHoldsUpItsCallForASecondAtMost: the reply of the
// FUNCTION LOAD that follows a call's EVAL is lost, the connection left
// open. The call, which has no deadline of its own, returns its decision
// within the load's bound, applied once; the failed load is logged; and the
// next decision finds the library Redis did load.
func TestALostLibraryLoadHoldsUpItsCallForASecondAtMost(t *testing.T) {
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
	if took := time.Since(start); took > loadTimeout+time.Second {
		t.Errorf("the decision took %v, want at most the load's bound (%v) and a round trip", took, loadTimeout)
	}
	if !res[0].Allowed || stored(t, s, "k") != 1 {
		t.Errorf("decision %+v, %d units stored: want admitted, applied once", res[0], stored(t, s, "k"))
	}
	if lines := storeLines(logs, "loading the function library"); len(lines) != 1 {
		t.Errorf("%d lines about the failed load, want 1: %v", len(lines), logs.get())
	}
	count.reset()
	decide(t, s, day("k", 1))
	if got := strings.Join(count.names, ","); got != "fcall" {
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
	if slices.Contains(count.names, "function") {
		t.Errorf("commands %v: a FUNCTION LOAD sent to a replica", count.names)
	}
}
