package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// Three one-time passwords per 15 minutes per phone number, exactly: a
// sliding log. The fourth waits until the first leaves the window.
func Example() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memory.New(memory.WithClock(func() time.Time { return now }))
	defer store.Close()

	otp := backend.Request{Key: "otp:+15550100", Algorithm: backend.SlidingLog, Limit: 3, Period: 15 * time.Minute, Cost: 1}
	for i := range 4 {
		res, err := store.Decide(context.Background(), []backend.Request{otp})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d: allowed=%v remaining=%d retry-after=%v\n", i+1, res[0].Allowed, res[0].Remaining, res[0].RetryAfter)
		now = now.Add(time.Minute)
	}
	// Output:
	// 1: allowed=true remaining=2 retry-after=0s
	// 2: allowed=true remaining=1 retry-after=0s
	// 3: allowed=true remaining=0 retry-after=0s
	// 4: allowed=false remaining=0 retry-after=12m0s
}

// Two rules decided at once, all or nothing: the per-day budget is not
// burnt by a request the per-minute rule rejects.
func ExampleStore_DecideInto() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memory.New(memory.WithClock(func() time.Time { return now }))
	defer store.Close()

	reqs := []backend.Request{
		{Key: "chat:minute:shop1", Algorithm: backend.GCRA, Limit: 2, Period: time.Minute, Cost: 1},
		{Key: "chat:day:shop1", Algorithm: backend.FixedWindow, Limit: 100, Period: 24 * time.Hour, Cost: 1},
	}
	results := make([]backend.Result, len(reqs)) // reused: no allocation per decision
	for range 3 {
		if err := store.DecideInto(context.Background(), reqs, results); err != nil {
			panic(err)
		}
		fmt.Printf("minute: %v (%d left), day: %d left\n", results[0].Allowed, results[0].Remaining, results[1].Remaining)
	}
	// Output:
	// minute: true (1 left), day: 99 left
	// minute: true (0 left), day: 98 left
	// minute: false (0 left), day: 98 left
}
