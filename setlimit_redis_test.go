package ceiling

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// On Redis, with the deny cache on, a key rejected under the old limit
// is admitted at once when the limit is raised (the cache's answer was
// for the old limit), and refused again when it is lowered: for every
// algorithm, Concurrency included.
func TestSetLimitOnRedis(t *testing.T) {
	inst := redistest.Shared(t)
	for _, alg := range append(backend.Algorithms(), backend.Concurrency) {
		t.Run(alg.String(), func(t *testing.T) {
			store := ceilingredis.New(inst.Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
			l := MustNew([]Rule{{Name: "api", Algorithm: alg, Limit: 3, Period: time.Minute}},
				WithBackend(store), WithTimeout(2*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
			defer l.Close()
			in := Input{Rule: "api", Key: "u"}
			decide := func() Decision {
				t.Helper()
				d, err := l.Decide(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed && d.Results[0].Fallback != 0 {
					t.Fatalf("decided by the fail mode %v", d.Results[0].Fallback)
				}
				return d
			}
			for range 3 {
				if !decide().Allowed {
					t.Fatal("rejected under the limit")
				}
			}
			for range 2 { // the second from the deny cache, where it remembers
				if decide().Allowed {
					t.Fatal("a 4th admitted under 3")
				}
			}
			if err := l.SetLimit("api", 5, 0); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if d := decide(); !d.Allowed || d.Results[0].Limit != 5 {
					t.Fatalf("request %d under a limit raised to 5: %+v", 4+i, d.Results[0])
				}
			}
			if err := l.SetLimit("api", 2, 0); err != nil {
				t.Fatal(err)
			}
			if d := decide(); d.Allowed {
				t.Fatalf("admitted with 5 held under a limit lowered to 2: %+v", d.Results[0])
			}
		})
	}
}
