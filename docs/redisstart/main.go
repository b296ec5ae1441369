// Command redisstart serves GET /hello to each client address at most 3
// times in any rolling minute, counted in the Redis of REDIS_URL so that
// every instance shares the limit. Its setUp is the README's Redis section.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
)

func main() {
	handler, closeAll, err := setUp(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	addr := "127.0.0.1:" + cmp.Or(os.Getenv("PORT"), "8080")
	log.Printf("listening on %s", addr)
	err = http.ListenAndServe(addr, handler)
	closeAll()
	log.Fatal(err)
}

// setUp connects to REDIS_URL: redis://host:6379/0, rediss:// for TLS,
// redis+cluster://host1:6379,host2:6379 or
// redis+sentinel://host1:26379,host2:26379/mymaster.
func setUp(ctx context.Context) (http.Handler, func(), error) {
	redisURL, err := ceilingredis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return nil, nil, err
	}
	// ParseURL's options set ContextTimeoutEnabled, as the store wants: the
	// limiter's timeout (100 ms) then bounds every command.
	client := redisURL.Client()
	limiter, err := ceiling.New([]ceiling.Rule{
		{Name: "hello", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute},
	},
		ceiling.WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix("hello"))),
		ceiling.WithKeySecret([]byte(os.Getenv("KEY_SECRET"))), // 32+ bytes, the same on every instance
	)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	closeAll := func() { limiter.Close(); client.Close() }

	// Refuse to start only on what will not fix itself: a wrong password, a
	// read-only replica, a full Redis, a Redis that does not reject. An
	// unreachable Redis is an outage: start degraded (FailLocal enforces
	// the limit on each instance, /healthz says so) and recover by itself.
	if err := limiter.Check(ctx); err != nil {
		if !errors.Is(err, backend.ErrUnreachable) && !errors.Is(err, ceiling.ErrTimeout) {
			closeAll()
			return nil, nil, err
		}
		log.Printf("starting degraded: %v", err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /hello", limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("GET /healthz", limiter.HealthHandler())
	return mux, closeAll, nil
}
