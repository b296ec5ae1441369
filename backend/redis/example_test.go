package redis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/redis/go-redis/v9"
)

// A Store decides every rule of a request in one script: here a minute
// limit and a day limit. When the minute limit rejects, the day limit is
// not charged. (miniredis stands in for Redis so the example runs
// anywhere; in production pass your redis.UniversalClient.)
func ExampleNew() {
	srv, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	store := ceilingredis.New(client, ceilingredis.WithPrefix("shop-api"))
	request := []backend.Request{
		{Key: "chat:minute:u42", Algorithm: backend.SlidingLog, Limit: 2, Period: time.Minute, Cost: 1},
		{Key: "chat:day:u42", Algorithm: backend.FixedWindow, Limit: 100, Period: 24 * time.Hour, Cost: 1},
	}
	for range 3 {
		res, err := store.Decide(context.Background(), request)
		if err != nil {
			panic(err)
		}
		fmt.Printf("minute: allowed=%v remaining=%d; day: remaining=%d\n", res[0].Allowed, res[0].Remaining, res[1].Remaining)
	}
	// Output:
	// minute: allowed=true remaining=1; day: remaining=99
	// minute: allowed=true remaining=0; day: remaining=98
	// minute: allowed=false remaining=0; day: remaining=98
}
