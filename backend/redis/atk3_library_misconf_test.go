package redis

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestAFailedBGSAVEStillAnswersAPeek_Attack: with stop-writes-on-bgsave-
// error (the default) and a failed BGSAVE, Redis refuses every write
// command with MISCONF, FCALL of a writing function whole, before it runs,
// while a script runs until its first write: a peek is answered by EVAL.
func TestAFailedBGSAVEStillAnswersAPeek_Attack(t *testing.T) {
	ctx := context.Background()
	for _, scripts := range []bool{true, false} {
		t.Run(map[bool]string{false: "FCALL", true: "EVALSHA"}[scripts], func(t *testing.T) {
			srv := redistest.ServerWith(t, "enable-protected-configs yes")
			c := srv.Client(t)
			s := New(c, WithDenyCache(0))
			if scripts {
				s.scriptsUntil.Store(math.MaxInt64)
			}
			decide(t, s, day("k", 1))
			for _, kv := range [][2]string{{"save", "3600 1"}, {"dir", "/proc"}} {
				if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			c.BgSave(ctx)
			deadline := time.Now().Add(5 * time.Second)
			for {
				info, _ := c.Info(ctx, "persistence").Result()
				if strings.Contains(info, "rdb_last_bgsave_status:err") && !strings.Contains(info, "rdb_bgsave_in_progress:1") {
					break
				}
				if time.Now().After(deadline) {
					t.Skip("could not make BGSAVE fail")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := c.Set(ctx, "probe", 1, 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "MISCONF") {
				t.Skipf("writes not refused: %v", err)
			}
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := s.Decide(dctx, []backend.Request{day("k", 0)}); err != nil {
				t.Errorf("a peek on a Redis refusing writes (MISCONF): %v; want it answered, as EVALSHA does (it writes nothing)", err)
			}
		})
	}
}
