package ceiling_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A front for another protocol (a websocket, a message bus) sends the
// rate-limit fields an HTTP response would carry: the policy of the rules
// it decides, at the limit that applied, and the state of the decision;
// on a refusal only the refusing rule's.
func ExampleLimiter_RateLimitPolicy() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "web:ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute}, // the HTTP front's
		{Name: "ws:user", Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "ws:room", Limit: 50, Period: time.Minute, Algorithm: ceiling.SlidingLog},
	})
	defer limiter.Close()
	for range 3 {
		d, err := limiter.Decide(context.Background(),
			ceiling.Input{Rule: "ws:user", Key: "alice", Limit: 2},
			ceiling.Input{Rule: "ws:room", Key: "lobby"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("allowed=%v\n  policy: %s\n  state:  %s\n", d.Allowed,
			limiter.RateLimitPolicy(&d, "ws:user", "ws:room"), d.RateLimit())
	}
	// Output:
	// allowed=true
	//   policy: "ws:user";q=2;w=60, "ws:room";q=50;w=60
	//   state:  "ws:user";r=1;t=0, "ws:room";r=49;t=0
	// allowed=true
	//   policy: "ws:user";q=2;w=60, "ws:room";q=50;w=60
	//   state:  "ws:user";r=0;t=60, "ws:room";r=48;t=0
	// allowed=false
	//   policy: "ws:user";q=2;w=60, "ws:room";q=50;w=60
	//   state:  "ws:user";r=0;t=60
}
