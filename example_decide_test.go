package ceiling_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// A queue worker limits without an *http.Request: each job names its
// account, its plan and its destination, and one call decides the
// account's rule (at the plan's limit) and the destination's rule together,
// all or nothing, with the limiter's fail modes and metrics. The rules have
// no Key: the worker passes the key values itself.
func ExampleLimiter_Decide() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "sms:account", Limit: 2, Period: time.Hour, Algorithm: ceiling.SlidingLog},
		{Name: "sms:to", Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog},
	})
	defer limiter.Close()
	perHour := map[string]int64{"free": 2, "pro": 100}
	jobs := []struct{ account, plan, to string }{
		{"acme", "free", "+15550001"},
		{"acme", "free", "+15550002"},
		{"acme", "free", "+15550003"}, // a third in the hour: over the free plan
		{"globex", "pro", "+15550001"},
		{"globex", "pro", "+15550001"},
		{"globex", "pro", "+15550001"}, // a fourth to one phone in 15 minutes
	}
	for _, j := range jobs {
		d, err := limiter.Decide(context.Background(),
			ceiling.Input{Rule: "sms:account", Key: j.account, Limit: perHour[j.plan]},
			ceiling.Input{Rule: "sms:to", Key: j.to},
		)
		switch {
		case err != nil: // the backend is down and a rule fails closed, or a bad input
			fmt.Println(j.account, j.to, "error:", err)
		case d.Allowed:
			fmt.Println(j.account, j.to, "sent")
		default:
			fmt.Printf("%s %s deferred by %s for %v\n", j.account, j.to, d.Rejected().Rule.Name, d.RetryAfter.Round(time.Minute))
		}
	}
	// Output:
	// acme +15550001 sent
	// acme +15550002 sent
	// acme +15550003 deferred by sms:account for 1h0m0s
	// globex +15550001 sent
	// globex +15550001 sent
	// globex +15550001 deferred by sms:to for 15m0s
}

// A worker charges what a job really cost once it knows: the tokens a model
// reply used, past the budget if need be, so the next jobs wait the debt
// out. A refund (a negative cost) gives back what a failed job reserved.
func ExampleLimiter_Charge() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "tokens", Limit: 1000, Period: 24 * time.Hour, Algorithm: ceiling.FixedWindow},
	})
	defer limiter.Close()
	ctx := context.Background()
	ask := func() bool {
		d, _ := limiter.Decide(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1"}) // is any budget left?
		return d.Allowed
	}
	fmt.Println("first job admitted:", ask())
	_ = limiter.Charge(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1", Cost: 1200}) // the reply used 1200
	fmt.Println("second job admitted:", ask())
	_ = limiter.Charge(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1", Cost: -400}) // a job refunded
	fmt.Println("third job admitted:", ask())
	// Output:
	// first job admitted: true
	// second job admitted: false
	// third job admitted: true
}

// A worker reserves 5 units for a job, the job fails and uses none, and it
// gives the 5 back with the Stamp of the admission that reserved them, so
// that the refund comes off those units and not off the units other jobs
// took since (without it, the newest units come back, and the budget those
// jobs used would be handed out again), and the Ticket its Decide asked
// for (Reserve), so that on a remote backend the refund applies at most
// once however often it is sent (an in-process store, which cannot lose
// a reply, writes none: the Ticket is 0). The store's clock is set by
// hand to show the window.
func ExampleLimiter_Charge_refund() {
	now := time.Unix(1_700_000_000, 0)
	store := memory.New(memory.WithClock(func() time.Time { return now }))
	defer store.Close()
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "tokens", Limit: 10, Period: time.Minute, Algorithm: ceiling.SlidingLog},
	}, ceiling.WithBackend(store))
	defer limiter.Close()
	ctx := context.Background()
	job, _ := limiter.Decide(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1", Cost: 5, Reserve: true}) // reserves 5
	now = now.Add(4 * time.Second)
	_, _ = limiter.Decide(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1", Cost: 5}) // another job uses 5
	now = now.Add(46 * time.Second)
	// The first job failed: it gives back what it reserved.
	_ = limiter.Charge(ctx, ceiling.Input{Rule: "tokens", Key: "shop-1", Cost: -5,
		Stamp: job.Results[0].Stamp, Ticket: job.Results[0].Ticket})
	now = now.Add(11 * time.Second) // 61 s: the other job's units still count
	res, _ := limiter.Peek(ctx, "tokens", "shop-1")
	fmt.Println("remaining at 61 s:", res.Remaining)
	// Output:
	// remaining at 61 s: 5
}
