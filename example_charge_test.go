package ceiling_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
)

// The order lookup runs while the limiter decides, so an admitted request
// does not wait for both in turn. A refused request never sees the order:
// the lookup is cancelled and its result dropped.
func ExamplePrefetch() {
	order := ceiling.Prefetch("order", func(ctx context.Context, r *http.Request) (string, error) {
		// A cache read or a database lookup; it must honour ctx.
		return "order 42 for " + r.URL.Query().Get("customer"), nil
	})
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "orders", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute,
	}}, ceiling.WithPrefetch(order))
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := order.Get(r) // typed: o is a string
		if err != nil {
			http.Error(w, "lookup failed", http.StatusBadGateway)
			return
		}
		fmt.Fprint(w, o)
	}))

	for range 2 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/order?customer=ann", nil))
		fmt.Println(w.Code, strings.Contains(w.Body.String(), "order 42"))
	}
	// Output:
	// 200 true
	// 429 false
}

// A chat endpoint's daily budget of 200,000 model tokens per shop, charged
// after each reply with the tokens the model reports. The estimate is 0: a
// request is admitted while any budget is left, and a reply that overruns
// the budget puts the shop into debt, which the next requests wait out.
// GCRA earns the budget back token by token, so the debt clears as soon as
// it is repaid.
func ExampleSettle() {
	shop := func(r *http.Request) (string, error) { return r.Header.Get("X-Shop"), nil }
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:      "chat:tokens",
		Key:       shop,
		Limit:     200_000,
		Period:    24 * time.Hour,
		Algorithm: ceiling.GCRA,
		Estimate:  func(*http.Request) (int64, error) { return 0, nil }, // known after the reply
	}})
	replies := []int64{150_000, 120_000, 500} // the tokens each reply uses
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used := replies[0] // in a real service: the model's reported usage
		replies = replies[1:]
		if err := ceiling.Settle(r, "chat:tokens", used); err != nil {
			panic(err)
		}
		fmt.Fprintf(w, "reply of %d tokens", used)
	}))

	// 270,000 of 200,000 tokens used: the third request waits until 70,001
	// are earned back, one every 432 ms, 30,240.432 s.
	for range 3 {
		r := httptest.NewRequest("POST", "/chat", nil)
		r.Header.Set("X-Shop", "shop-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			fmt.Println(w.Code, w.Body)
		} else {
			fmt.Println(w.Code, "Retry-After:", w.Header().Get("Retry-After"))
		}
	}
	// Output:
	// 200 reply of 150000 tokens
	// 200 reply of 120000 tokens
	// 429 Retry-After: 30241
}

// Support tooling looks at a customer's budget without spending it, and
// restores it.
func ExampleLimiter_Peek() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "otp:phone", Key: ceiling.Header("X-Phone"), Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog,
	}})
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		r := httptest.NewRequest("POST", "/otp", nil)
		r.Header.Set("X-Phone", "+254700000000")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}

	ctx := context.Background()
	res, _ := limiter.Peek(ctx, "otp:phone", "+254700000000")
	fmt.Println("remaining:", res.Remaining)
	_ = limiter.Reset(ctx, "otp:phone", "+254700000000")
	res, _ = limiter.Peek(ctx, "otp:phone", "+254700000000")
	fmt.Println("after reset:", res.Remaining)
	// Output:
	// remaining: 0
	// after reset: 3
}
