package redis

import (
	"context"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAFullRedisWithoutTheLibraryIsNotLoadedOnEveryDecision_Attack: a
// Redis that lost its library and is full (maxmemory, noeviction). The
// first peek is FCALL, then EVAL; the refusal sends EVALSHA for a while,
// and the FUNCTION LOAD Redis refuses with OOM is not sent again at once:
// one round trip per decision in steady state.
func TestAFullRedisWithoutTheLibraryIsNotLoadedOnEveryDecision_Attack(t *testing.T) {
	srv := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	count := countCommands(client)
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1))
	if err := srv.Client(t).FunctionFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Fill(t)
	var sent []string
	for i := range 5 {
		count.reset()
		decide(t, s, day("k", 0))
		sent = append(sent, strings.Join(count.sent(), ","))
		if i == 0 { // the load it started, refused for want of memory, takes a while on a loaded machine
			waitFor(t, "the library's load refused", func() bool { return s.scriptsUntil.Load() != 0 })
		}
	}
	if last := sent[len(sent)-1]; last != "evalsha" && last != "fcall" && last != "eval" {
		t.Errorf("each peek on a full Redis without the library sent %v; want one command in steady state", sent)
	}
}
