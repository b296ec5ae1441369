package redis

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestScriptsUntilClearLosesARefusal_Attack: 9d088ef lets command clear
// an expired scriptsUntil with CompareAndSwap(u, 0). useScripts, which a
// refusal of functions (or OOM) calls, loads scriptsUntil, sees it passed
// and swaps in now+d with CompareAndSwap(old, ...): when command's clear
// lands between its load and its swap, the swap fails, useScripts reports
// "already refused" (refuseFunctions then logs nothing) and scriptsUntil
// stays 0. The refusal is lost: the Store goes on sending FCALL to a
// server that refused functions, each call paying a refused FCALL and an
// EVAL of the whole library's source until another refusal lands. Before
// the change only useScripts wrote scriptsUntil, so a failed swap meant
// another refusal had set it. Bounded to 5 s of tries.
func TestScriptsUntilClearLosesARefusal_Attack(t *testing.T) {
	s := &Store{}
	deadline := time.Now().Add(5 * time.Second)
	tries := 0
	for time.Now().Before(deadline) {
		tries++
		s.scriptsUntil.Store(time.Now().UnixNano() - 1) // an earlier refusal's window, just passed
		var start atomic.Bool
		var wg sync.WaitGroup
		var refused bool
		wg.Add(2)
		go func() {
			defer wg.Done()
			for !start.Load() {
				runtime.Gosched()
			}
			s.command(nil, decideScript) // a decision on the hot path
		}()
		go func() {
			defer wg.Done()
			for !start.Load() {
				runtime.Gosched()
			}
			refused = s.useScripts(scriptsFor) // a fresh refusal
		}()
		start.Store(true)
		wg.Wait()
		if !refused && s.scriptsUntil.Load() == 0 {
			cmd := s.command(nil, decideScript)
			t.Fatalf("after %d tries: a refusal raced with the clear; useScripts reported it already refused, scriptsUntil is 0, and the next decision sends %v to the server that refused functions", tries, cmd[0])
		}
	}
	t.Logf("%d tries, no refusal lost", tries)
}

// atk4RefusalHook runs onRefused in the caller's goroutine when an FCALL
// comes back refused, before the Store reads the refusal.
type atk4RefusalHook struct{ onRefused func() }

func (h atk4RefusalHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h atk4RefusalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd) // the Store's noRetry wrapper: the error is the one returned
		if cmd.Name() == "fcall" && refusesFunctions(err) {
			h.onRefused()
		}
		return err
	}
}

func (h atk4RefusalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Name() == "fcall" && refusesFunctions(cmd.Err()) {
				h.onRefused()
			}
		}
		return err
	}
}

// TestRefusalLostToTheClearSendsFCALLAgain_Attack is
// TestScriptsUntilClearLosesARefusal_Attack end to end, on a server whose
// user may not call functions (ACL -fcall -function): while a decision's
// FCALL is in flight, an earlier window (as a 1 s OOM window set by
// another call) passes, and another decision starts as the refusal comes
// back. When its clear wins the race, the Store stays on FCALL: the next
// decision sends FCALL again, is refused, and pays an EVAL of the
// library's source, and the refusal's Warn line is not written. The race
// is a few nanoseconds wide: bounded to 20 s of tries, it fails in most
// runs (3 of 3 here, after 330 to 4747 tries); it passes on 9d088ef^,
// where command never writes scriptsUntil.
func TestRefusalLostToTheClearSendsFCALLAgain_Attack(t *testing.T) {
	srv := redistest.Server(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { client.Close() })
	var s *Store
	var refused atomic.Int64 // the expired window the hook stored, 0 before it runs
	client.AddHook(atk4RefusalHook{onRefused: func() {
		u := time.Now().UnixNano() - 1 // a window that passed while the FCALL was out
		s.scriptsUntil.Store(u)
		refused.Store(u) // another decision starts
	}})
	count := countCommands(client)
	s = New(client, WithDenyCache(0))
	// The other decision's clear must land between useScripts' load and
	// its swap: it learns, in spins after the hook, when the swap lands
	// and aims just before it.
	seen := int64(0)
	deadline := time.Now().Add(20 * time.Second)
	for tries := 1; time.Now().Before(deadline); tries++ {
		s.scriptsUntil.Store(0)
		refused.Store(0)
		aim := int64(-1)
		if seen > 0 {
			aim = seen - 1 - int64(tries*7919)%max(1, seen/4)
		}
		done := make(chan int64)
		go func() {
			var u int64
			for u = refused.Load(); u == 0; u = refused.Load() {
				if time.Now().After(deadline.Add(time.Second)) {
					done <- 0
					return
				}
			}
			n := int64(0)
			for ; aim < 0 || n < aim; n++ {
				if aim < 0 && s.scriptsUntil.Load() != u {
					break // learning: the swap landed after n spins
				}
			}
			if aim >= 0 {
				s.command(nil, decideScript)
			}
			done <- n
		}()
		decide(t, s, day("k", 1))
		if n := <-done; aim < 0 && n > 0 {
			seen = n
		}
		if s.scriptsUntil.Load() == 0 {
			count.reset()
			decide(t, s, day("k", 1))
			t.Fatalf("after %d tries: a decision's refusal of FCALL was lost (scriptsUntil 0); the next decision sent %v, want evalsha alone", tries, scriptNames(count.sent()))
		}
		if tries%64 == 0 {
			seen = 0 // learn again: the path's timing drifts
		}
	}
}
