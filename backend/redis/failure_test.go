package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestErrorsNameTheirKind decides against servers misconfigured the ways a
// deployment can be, through clients with go-redis's default options: each
// error wraps the backend failure kind that names its root cause, and
// returns with that cause rather than after the budget (go-redis, left to
// itself, retries READONLY and refused dials until the deadline, and the
// cause is lost to "timed out").
func TestErrorsNameTheirKind(t *testing.T) {
	refused := func(t *testing.T) *redis.Client {
		srv := redistest.Server(t)
		srv.Kill()
		return defaultClientOpts(t, &redis.Options{Addr: srv.Addr})
	}
	replica := func(t *testing.T) *redis.Client {
		return defaultClientOpts(t, &redis.Options{Addr: replicaServer(t).Addr})
	}
	full := func(t *testing.T) *redis.Client {
		return defaultClientOpts(t, &redis.Options{Addr: fullServer(t).Addr})
	}
	locked := func(password string) func(t *testing.T) *redis.Client {
		return func(t *testing.T) *redis.Client {
			srv := redistest.ServerWith(t, "requirepass s3cret")
			return defaultClientOpts(t, &redis.Options{Addr: srv.Addr, Password: password})
		}
	}
	tests := []struct {
		name   string
		client func(t *testing.T) *redis.Client
		kind   error
		cause  string
	}{
		{"refused", refused, backend.ErrUnreachable, "connection refused"},
		{"read-only replica", replica, backend.ErrReadOnly, "READONLY"},
		{"out of memory", full, backend.ErrOutOfMemory, "OOM"},
		{"wrong password", locked("wrong"), backend.ErrAuth, "WRONGPASS"},
		{"no password", locked(""), backend.ErrAuth, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(tt.client(t), WithDenyCache(0))
			for _, reqs := range [][]backend.Request{
				{day("one", 1)},
				{day("a", 1), day("b", 1), day("c", 1), day("d", 1)}, // many arguments
			} {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				_, err := s.Decide(ctx, reqs)
				cancel()
				if !errors.Is(err, tt.kind) {
					t.Fatalf("%d requests: err = %v, want it to wrap %v", len(reqs), err, tt.kind)
				}
				if !strings.Contains(err.Error(), tt.cause) {
					t.Errorf("%d requests: err = %v, want it to name %q", len(reqs), err, tt.cause)
				}
				if tt.kind != backend.ErrUnreachable && errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%d requests: err = %v: the cause came only with the deadline", len(reqs), err)
				}
			}
			if tt.kind == backend.ErrReadOnly {
				// Sent once each (go-redis retries READONLY by itself), plus
				// the EVAL of each (the lone call's batch script, the 4
				// requests' decide script) after the replica, which lacks the
				// library its master never had, answered that it has none.
				if got, want := scriptCalls(t, s.client.(*redis.Client)), 4; got != want {
					t.Errorf("the replica ran FCALL, EVALSHA and EVAL %d times for 2 decisions, want %d", got, want)
				}
			}
		})
	}
}

func defaultClientOpts(t *testing.T, opt *redis.Options) *redis.Client {
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// scriptCalls is how many FCALL, EVALSHA and EVAL commands the server ran
// (INFO commandstats), failed ones included.
func scriptCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_fcall:") || strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			calls, _, _ := strings.Cut(strings.TrimPrefix(line[strings.IndexByte(line, ':')+1:], "calls="), ",")
			c, err := strconv.Atoi(calls)
			if err != nil {
				t.Fatalf("INFO commandstats line %q: %v", line, err)
			}
			n += c
		}
	}
	return n
}

// redisError is a reply error as go-redis returns it.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

func TestClassifyNamesTheKind(t *testing.T) {
	tests := []struct {
		err  error
		kind error // nil: no kind
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, backend.ErrUnreachable},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, backend.ErrUnreachable},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, backend.ErrUnreachable},
		{io.EOF, backend.ErrUnreachable},
		{redis.ErrClosed, backend.ErrUnreachable},
		{&net.DNSError{Err: "no such host", Name: "redis.internal"}, backend.ErrUnreachable},
		{redisError("NOAUTH Authentication required."), backend.ErrAuth},
		{redisError("WRONGPASS invalid username-password pair or user is disabled."), backend.ErrAuth},
		{redisError("NOPERM this user has no permissions to run the 'evalsha' command"), backend.ErrAuth},
		{redisError("ERR Protocol error: unauthenticated multibulk length"), backend.ErrAuth},
		{redisError("READONLY You can't write against a read only replica."), backend.ErrReadOnly},
		{redisError("OOM command not allowed when used memory > 'maxmemory'."), backend.ErrOutOfMemory},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, nil}, // a timeout
		{redisError("ERR unknown command"), nil},
		{fmt.Errorf("wrapped: %w", redisError("READONLY x")), backend.ErrReadOnly},
	}
	kinds := []error{backend.ErrUnreachable, backend.ErrAuth, backend.ErrReadOnly, backend.ErrOutOfMemory}
	for _, tt := range tests {
		got := classify(tt.err)
		if !errors.Is(got, tt.err) {
			t.Errorf("classify(%v) = %v, which loses the cause", tt.err, got)
		}
		for _, k := range kinds {
			if errors.Is(got, k) != (k == tt.kind) {
				t.Errorf("classify(%v) = %v: wraps %v = %v, want %v", tt.err, got, k, errors.Is(got, k), k == tt.kind)
			}
		}
	}
}

// fullServer is a Redis over its maxmemory with noeviction, as a full Redis
// is: 4mb of data, then a limit of 1mb. Every write is refused with OOM.
func fullServer(t *testing.T) *redistest.Instance {
	srv := redistest.ServerWith(t, "maxmemory-policy noeviction")
	c := srv.Client(t)
	ctx := context.Background()
	value := strings.Repeat("x", 64<<10)
	for i := range 64 {
		if err := c.Set(ctx, "fill:"+strconv.Itoa(i), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	return srv
}

// replicaServer is a read-only replica of a master of its own: every write
// is refused with READONLY.
func replicaServer(t *testing.T) *redistest.Instance {
	master := redistest.Server(t)
	_, port, _ := strings.Cut(master.Addr, ":")
	return redistest.ServerWith(t, "replicaof 127.0.0.1 "+port)
}
