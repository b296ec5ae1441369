package ceiling_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/golang-jwt/jwt/v5"
)

// A limit per plan: the verified "plan" claim of the caller's token picks
// the limit, pro 5 a minute and every other plan the rule's 2, decided in
// the same backend call as every other rule. A token without a plan (the
// claim lookup's ErrNoKey, passed on) gets the rule's own limit too. A
// request without a verified token has no "sub", so this rule skips it: it
// is not limited here. To limit those callers too, key the rule by
// ceiling.FirstOf(sub, ceiling.RemoteAddr) (the account, else the address;
// see the JWTClaim example) or add a rule keyed by the address.
// RateLimit-Policy and the 429's problem body show the limit that applied
// to each request.
func ExampleRule_limits() {
	secret := []byte("an example secret of at least 32 bytes")
	keyfunc := func(*jwt.Token) (any, error) { return secret, nil }
	methods := []string{"HS256"}
	plan := ceiling.Must(ceiling.JWTClaim("plan", keyfunc, methods))
	perPlan := map[string]int64{"pro": 5} // others: the rule's Limit

	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:   "api",
		Key:    ceiling.Must(ceiling.JWTClaim("sub", keyfunc, methods)),
		Limit:  2,
		Period: time.Minute, Algorithm: ceiling.SlidingLog,
		Limits: func(r *http.Request) (limit, burst int64, err error) {
			p, err := plan(r)
			if err != nil {
				return 0, 0, err // ErrNoKey (no plan): the rule's Limit
			}
			return perPlan[p], 0, nil
		},
	}})
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for _, user := range []struct{ sub, plan string }{{"ana", "free"}, {"bo", "pro"}, {"eve", ""}} {
		claims := jwt.MapClaims{"sub": user.sub}
		if user.plan != "" {
			claims["plan"] = user.plan
		}
		token, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
		for range perPlan[user.plan] + 3 {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Authorization", "Bearer "+token)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code == http.StatusTooManyRequests {
				fmt.Println(user.sub, w.Code, w.Header().Get("RateLimit-Policy"), w.Body.String())
				break
			}
			fmt.Println(user.sub, w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		}
	}
	// Output:
	// ana 200 "api";q=2;w=60 "api";r=1;t=0
	// ana 200 "api";q=2;w=60 "api";r=0;t=60
	// ana 429 "api";q=2;w=60 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"quota exceeded for api (2 per 60 s); retry in 60 s","violated-policies":["api"],"retry-after":60}
	// bo 200 "api";q=5;w=60 "api";r=4;t=0
	// bo 200 "api";q=5;w=60 "api";r=3;t=0
	// bo 200 "api";q=5;w=60 "api";r=2;t=0
	// bo 200 "api";q=5;w=60 "api";r=1;t=0
	// bo 200 "api";q=5;w=60 "api";r=0;t=60
	// bo 429 "api";q=5;w=60 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"quota exceeded for api (5 per 60 s); retry in 60 s","violated-policies":["api"],"retry-after":60}
	// eve 200 "api";q=2;w=60 "api";r=1;t=0
	// eve 200 "api";q=2;w=60 "api";r=0;t=60
	// eve 429 "api";q=2;w=60 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"quota exceeded for api (2 per 60 s); retry in 60 s","violated-policies":["api"],"retry-after":60}
}
