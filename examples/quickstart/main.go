// Command quickstart serves GET /hello to each client address at most 3
// times in any rolling minute: the program at the top of ceiling's README.
package main

import (
	"cmp"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/ceiling-go/ceiling"
)

func main() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:   "hello",            // named in headers, 429 bodies and metrics
		Key:    ceiling.RemoteAddr, // one budget per client address
		Limit:  3,                  // at most 3 requests
		Period: time.Minute,        // in any rolling minute
	}})

	mux := http.NewServeMux()
	mux.Handle("GET /hello", limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))

	addr := "127.0.0.1:" + cmp.Or(os.Getenv("PORT"), "8080")
	log.Printf("listening on %s", addr)
	err := http.ListenAndServe(addr, mux)
	limiter.Close() // stops its memory store's goroutine (log.Fatal runs no defers)
	log.Fatal(err)
}
