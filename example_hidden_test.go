package ceiling_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A rule keyed on someone other than the caller (the phone an OTP goes to)
// is Hidden: its state is in no header, so a caller cannot watch another
// person's number. A 429 shows only the rules that refused it.
func ExampleRule_hidden() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:phone", Key: ceiling.Header("X-Phone"), Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog, Hidden: true},
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 2, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog},
	})
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, phone := range []string{"+254700000001", "+254700000002", "+254700000003"} {
		r := httptest.NewRequest("POST", "/otp", nil)
		r.Header.Set("X-Phone", phone)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"), strings.TrimSpace(w.Header().Get("RateLimit-Policy")))
	}
	// Output:
	// 200 "otp:ip";r=1;t=0 "otp:ip";q=2;w=900
	// 200 "otp:ip";r=0;t=900 "otp:ip";q=2;w=900
	// 429 "otp:ip";r=0;t=900 "otp:ip";q=2;w=900
}
