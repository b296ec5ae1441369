package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestALoneDecisionAllocates pins what a lone decision, sent by its caller
// through DecideInto, allocates on the client: its key, the EVALSHA's
// arguments and command, and what go-redis reads and checks; a success
// pays nothing for the error replies it did not get. Arguments go by
// value, not by pointer: go-redis' hooks and tracing print them.
func TestALoneDecisionAllocates(t *testing.T) {
	srv := redistest.Shared(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
	reqs := []backend.Request{{Key: "u", Limit: backend.MaxLimit, Period: time.Minute, Cost: 1}}
	res := make([]backend.Result, 1)
	decide := func() {
		if err := s.DecideInto(context.Background(), reqs, res); err != nil || !res[0].Allowed {
			t.Fatalf("DecideInto: %v, allowed %v", err, res[0].Allowed)
		}
	}
	decide()
	if got, most := testing.AllocsPerRun(200, decide), 15.0; got > most {
		t.Errorf("a lone decision allocates %v times, want at most %v", got, most)
	}
}
