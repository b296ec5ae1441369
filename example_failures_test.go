package ceiling_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
)

// A login endpoint that counts only failed attempts: 3 per account and 10
// per address per rolling 15 minutes. Each rule's Estimate is 0, so a
// request is admitted while a failure is left and, unless the handler
// settles, counts nothing; a failed login settles 1 on every rule. The
// hundred users of an office behind one NAT address log in all day,
// while a guesser elsewhere is stopped by the account rule, then by the
// address rule, right password or not.
func ExampleSettle_failuresOnly() {
	failures := []string{"login:account", "login:ip"}
	onlyFailures := func(*http.Request) (int64, error) { return 0, nil }
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "login:account", Key: ceiling.Normalize(ceiling.Must(ceiling.FormField("user")), ceiling.Lower),
			Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog, Estimate: onlyFailures},
		{Name: "login:ip", Key: ceiling.RemoteAddr,
			Limit: 10, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog, Estimate: onlyFailures},
	})
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("password") != "right" { // your password check
			for _, rule := range failures {
				ceiling.Settle(r, rule, 1) // a failure counts on every rule
			}
			http.Error(w, "wrong user or password", http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "welcome") // settles at the estimate: counts nothing
	}))
	login := func(addr, user, password string) int {
		body := url.Values{"user": {user}, "password": {password}}.Encode()
		r := httptest.NewRequest("POST", "/login", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = addr + ":40000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	office := func() map[int]int {
		got := map[int]int{}
		for i := range 100 {
			got[login("203.0.113.7", fmt.Sprintf("user-%d", i), "right")]++
		}
		return got
	}

	fmt.Println("office:", office())
	var alice []int
	for _, pw := range []string{"guess1", "guess2", "guess3", "right"} {
		alice = append(alice, login("198.51.100.9", "Alice", pw))
	}
	fmt.Println("guessing alice:", alice)
	others := map[int]int{}
	for i := range 9 {
		others[login("198.51.100.9", fmt.Sprintf("victim-%d", i), "guess")]++
	}
	fmt.Println("guessing others from the same address:", others)
	fmt.Println("office:", office())
	// Output:
	// office: map[200:100]
	// guessing alice: [401 401 401 429]
	// guessing others from the same address: map[401:7 429:2]
	// office: map[200:100]
}
