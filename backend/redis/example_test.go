package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/redis/go-redis/v9"
)

// What a service writes: a limiter whose rules are counted on Redis, so
// that every instance of the service shares them. Check at start-up proves
// that Redis answers and really rejects. (miniredis stands in for Redis so
// that the example runs anywhere; pass your go-redis client: a
// *redis.Client, a Sentinel failover client or a *redis.ClusterClient.)
func ExampleNew() {
	srv, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	limiter, err := ceiling.New([]ceiling.Rule{
		{Name: "api", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute},
	}, ceiling.WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix("shop-api"))))
	if err != nil {
		panic(err)
	}
	defer limiter.Close()
	if err := limiter.Check(context.Background()); err != nil {
		panic(err)
	}

	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	}))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		fmt.Println(w.Code)
	}
	// The stored key holds a digest of the address, not the address, as
	// its hash tag, then the rule.
	for _, k := range srv.Keys() {
		prefix, rest, _ := strings.Cut(k, ":{")
		tag, rule, _ := strings.Cut(rest, "}:")
		fmt.Printf("%s:{<%d-character digest>}:%s\n", prefix, len(tag), rule)
	}
	// Output:
	// 200
	// 200
	// 429
	// shop-api:{<22-character digest>}:api
}

// A Store decides every rule of a request in one script: here a minute
// limit and a day limit. When the minute limit rejects, the day limit is
// not charged. This is the call the limiter makes; services use [New]'s
// example.
func ExampleStore_Decide() {
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

// A store's errors say what kind of failure stopped it, for the limiter's
// health report and your alerts; the text keeps the detail for logs.
func ExampleStore_Decide_failureKind() {
	srv, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	store := ceilingredis.New(client)
	srv.Close() // Redis goes away

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = store.Decide(ctx, []backend.Request{{Key: "api:d1", Limit: 10, Period: time.Minute, Cost: 1}})
	fmt.Println("unreachable:", errors.Is(err, backend.ErrUnreachable))
	// Output:
	// unreachable: true
}
