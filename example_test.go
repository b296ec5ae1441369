package ceiling_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A limit of 2 per minute per client address, counted exactly in a rolling
// window: the third request in the minute is refused with 429, a problem
// body and the time to wait.
func ExampleLimiter_Handler() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:      "api",
		Key:       ceiling.RemoteAddr,
		Limit:     2,
		Period:    time.Minute,
		Algorithm: ceiling.SlidingLog,
	}})
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		fmt.Printf("%d %s retry-after=%q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	fmt.Println(w429Body(h))
	// Output:
	// 200 "api";r=1;t=0 retry-after=""
	// 200 "api";r=0;t=60 retry-after=""
	// 429 "api";r=0;t=60 retry-after="60"
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"quota exceeded for api (2 per 60 s); retry in 60 s","violated-policies":["api"],"retry-after":60}
}

func w429Body(h http.Handler) string {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	return w.Body.String()
}

// Two rules on one request are decided together: a request the minute rule
// refuses does not spend the day budget.
func ExampleNew() {
	shop := ceiling.Static("shop-1") // in a real service: the verified shop of the caller
	limiter, err := ceiling.New([]ceiling.Rule{
		{Name: "chat:minute", Key: shop, Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "chat:day", Key: shop, Limit: 1000, Period: 24 * time.Hour, Algorithm: ceiling.SlidingLog},
	})
	if err != nil {
		panic(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := 0; i < 4; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/api/chat", nil))
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// A 429 shows only the rule that refused it; the day's budget is as the
	// second request left it.
	day, _ := limiter.Peek(context.Background(), "chat:day", "shop-1")
	fmt.Println("chat:day remaining:", day.Remaining)
	// Output:
	// 200 "chat:minute";r=1;t=0, "chat:day";r=999;t=0
	// 200 "chat:minute";r=0;t=60, "chat:day";r=998;t=0
	// 429 "chat:minute";r=0;t=60
	// 429 "chat:minute";r=0;t=60
	// chat:day remaining: 998
}

// New reports configuration mistakes by name, before any request is served.
func ExampleNew_invalid() {
	_, err := ceiling.New([]ceiling.Rule{{Name: "otp:phone", Key: ceiling.RemoteAddr, Limit: 3, Period: 15 * time.Minute, Cost: 5}})
	fmt.Println(err)
	// Output: ceiling: rule "otp:phone": cost 5 can never fit in 3
}
