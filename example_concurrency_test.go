package ceiling_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A worker runs exports, at most 2 per tenant at once across every
// instance sharing the backend: each export takes a slot with Decide and
// gives it back with Release when it ends.
func ExampleDecision_Release() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "exports", Limit: 2, Period: time.Minute, Algorithm: ceiling.Concurrency},
	})
	defer limiter.Close()
	ctx := context.Background()
	start := func(id string) (ceiling.Decision, bool) {
		d, err := limiter.Decide(ctx, ceiling.Input{Rule: "exports", Key: "tenant-1"})
		fmt.Printf("export %s: admitted %v", id, d.Allowed)
		if !d.Allowed {
			fmt.Printf(", retry in %v", d.RetryAfter)
		}
		fmt.Println()
		return d, err == nil && d.Allowed
	}
	a, _ := start("a")
	b, _ := start("b")
	start("c")  // both slots are taken
	a.Release() // export a is done
	c, _ := start("c")
	b.Release()
	c.Release()
	// Output:
	// export a: admitted true
	// export b: admitted true
	// export c: admitted false, retry in 1s
	// export c: admitted true
}

// The middleware holds a shop's slot while its handler runs: with one
// answer in flight the next is refused, and once it is over the next is
// admitted. RateLimit-Policy shows the rule as concurrent requests.
func ExampleConcurrency() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "answers", Key: ceiling.Header("X-Shop"), Limit: 1, Period: time.Minute,
		Algorithm: ceiling.Concurrency,
	}})
	defer limiter.Close()
	inside, leave := make(chan struct{}), make(chan struct{})
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("slow") {
			close(inside)
			<-leave
		}
	}))
	send := func(target string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", target, nil)
		r.Header.Set("X-Shop", "acme")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- send("/chat?slow") }()
	<-inside
	w := send("/chat")
	fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Header().Get("RateLimit-Policy"))
	close(leave)
	fmt.Println((<-done).Code)
	fmt.Println(send("/chat").Code)
	// Output:
	// 429 1 "answers";q=1;qu="concurrent-requests"
	// 200
	// 200
}
