package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAUserAllowedOnlyFCALLIsNotSwitchedToEVALSHA_Attack: an ACL that lets
// the limiter call functions only (no FUNCTION, no EVAL or EVALSHA; an
// operator deploys the library). After a FUNCTION FLUSH the decisions fail
// with NOPERM while the library is missing; a refused FUNCTION LOAD does
// not switch the Store to EVALSHA, so once the operator has loaded the
// library again, one FCALL answers.
func TestAUserAllowedOnlyFCALLIsNotSwitchedToEVALSHA_Attack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Server(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-function", "-eval", "-evalsha", "-script").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.FunctionLoadReplace(ctx, library).Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0))
	decide(t, s, day("k", 1))
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Decide(ctx, []backend.Request{day("k", 1)}) // fails: nobody here may load it
	t.Logf("while the library is missing: %v", err)
	if err := admin.FunctionLoadReplace(ctx, library).Err(); err != nil { // the operator puts it back
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 3 {
		if _, err := s.Decide(ctx, []backend.Request{day("k", 1)}); err != nil {
			t.Errorf("decision %d after the library is back: %v; want it answered by FCALL (scriptsUntil %v from now)", i+1, err, time.Until(time.Unix(0, s.scriptsUntil.Load())).Round(time.Second))
		}
	}
}
