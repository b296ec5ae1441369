package ceiling_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/golang-jwt/jwt/v5"
)

// Behind a proxy that appends to X-Forwarded-For, the client is the
// right-most address the proxy did not write about itself: whatever the
// client put on the left is ignored. A client that reaches the server
// directly is its connection's address, headers or not.
func ExampleClientIP() {
	key := ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedFor("10.0.0.0/8")))

	viaProxy := httptest.NewRequest("GET", "/", nil)
	viaProxy.RemoteAddr = "10.0.0.1:40000"                         // our load balancer
	viaProxy.Header.Set("X-Forwarded-For", "1.2.3.4, 203.0.113.9") // "1.2.3.4" is the client's own invention
	direct := httptest.NewRequest("GET", "/", nil)
	direct.RemoteAddr = "203.0.113.50:40000"
	direct.Header.Set("X-Forwarded-For", "1.2.3.4")
	v6 := httptest.NewRequest("GET", "/", nil)
	v6.RemoteAddr = "[2001:db8:a:b:1234:5678:9abc:def0]:40000"

	for _, r := range []*http.Request{viaProxy, direct, v6} {
		k, _ := key(r)
		fmt.Println(k)
	}
	// Output:
	// 203.0.113.9
	// 203.0.113.50
	// 2001:db8:a:b::/64
}

// On a platform whose proxy addresses are not published, count the proxies
// instead: behind one, the client is the right-most X-Forwarded-For entry,
// whatever the client wrote to its left.
func ExampleTrustXForwardedForHops() {
	key := ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedForHops(1)))

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "100.64.3.2:40000"                       // the platform's router
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.9") // "6.6.6.6" is the client's own invention
	k, _ := key(r)
	fmt.Println(k)
	// Output: 203.0.113.9
}

// Cloudflare sends the client's address in CF-Connecting-IP: believe it only
// from Cloudflare's published ranges (two of them here). A client that
// reaches the origin directly is its connection's address.
func ExampleTrustHeader() {
	key := ceiling.Must(ceiling.ClientIP(ceiling.TrustHeader("CF-Connecting-IP", "173.245.48.0/20", "2400:cb00::/32")))

	viaCDN := httptest.NewRequest("GET", "/", nil)
	viaCDN.RemoteAddr = "173.245.48.7:40000"
	viaCDN.Header.Set("CF-Connecting-IP", "203.0.113.9")
	direct := httptest.NewRequest("GET", "/", nil)
	direct.RemoteAddr = "198.51.100.20:40000"
	direct.Header.Set("CF-Connecting-IP", "1.2.3.4")
	for _, r := range []*http.Request{viaCDN, direct} {
		k, _ := key(r)
		fmt.Println(k)
	}
	// Output:
	// 203.0.113.9
	// 198.51.100.20
}

// A platform that sets Fly-Client-IP on every request and drops the
// client's own copy can be believed from any peer; without the header the
// key is the peer.
func ExampleTrustHeaderFromAnywhere() {
	key := ceiling.Must(ceiling.ClientIP(ceiling.TrustHeaderFromAnywhere("Fly-Client-IP")))

	viaEdge := httptest.NewRequest("GET", "/", nil)
	viaEdge.RemoteAddr = "[fdaa:0:1::3]:40000"
	viaEdge.Header.Set("Fly-Client-IP", "203.0.113.9")
	internal := httptest.NewRequest("GET", "/", nil)
	internal.RemoteAddr = "[fdaa:0:1::4]:40000"
	for _, r := range []*http.Request{viaEdge, internal} {
		k, _ := key(r)
		fmt.Println(k)
	}
	// Output:
	// 203.0.113.9
	// fdaa:0:1::/64
}

// A client that sends a fresh X-Forwarded-For with every request does not
// get a fresh budget.
func ExampleClientIP_spoofedHeader() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "ip", Key: ceiling.Must(ceiling.ClientIP()), Limit: 2, Period: time.Minute, Algorithm: ceiling.SlidingLog,
	}})
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := range 4 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
	}
	// Output:
	// 200
	// 200
	// 429
	// 429
}

// The account of a verified token, else the client address: a token with a
// forged subject is just an anonymous request from its address.
func ExampleJWTClaim() {
	secret := []byte("an example secret, 32 bytes long")
	user := ceiling.Must(ceiling.JWTClaim("sub", func(*jwt.Token) (any, error) { return secret, nil }, []string{"HS256"}))
	key := ceiling.FirstOf(user, ceiling.RemoteAddr)

	for _, signer := range [][]byte{secret, []byte("not the server's secret at all!!")} {
		tok, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice"}).SignedString(signer)
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		k, _ := key(r)
		fmt.Println(k)
	}
	// Output:
	// 0:alice
	// 1:192.0.2.1
}

// An OTP endpoint limited by the destination phone number in the JSON body,
// however it is spelled. The handler still reads the whole body.
func ExampleBodyField() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name:      "otp:to",
		Key:       ceiling.Normalize(ceiling.Must(ceiling.BodyField("to")), ceiling.Digits),
		Limit:     2,
		Period:    15 * time.Minute,
		Algorithm: ceiling.SlidingLog,
	}})
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "sent (%d body bytes)", len(body))
	}))
	for _, body := range []string{`{"to": "+254 700 000 000"}`, `{"to": "254700000000"}`, `{"to": "254-700-000-000"}`, `{"to": "+254 7OO"}`} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/otp", strings.NewReader(body)))
		fmt.Println(w.Code, strings.SplitN(w.Body.String(), "\n", 2)[0])
	}
	// Output:
	// 200 sent (26 body bytes)
	// 200 sent (22 body bytes)
	// 429 {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"quota exceeded for otp:to (2 per 900 s); retry in 900 s","violated-policies":["otp:to"],"retry-after":900}
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"ceiling: rule \"otp:to\": not a phone number: only digits, spaces and +-.() allowed"}
}

// On Go 1.22's ServeMux, wrap each handler so that the pattern is known:
// /users/1 and /users/2 are one route.
func ExampleRouteWithMethod() {
	key := ceiling.Join(ceiling.RemoteAddr, ceiling.RouteWithMethod)
	mux := http.NewServeMux()
	mux.HandleFunc("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		k, _ := key(r)
		fmt.Println(k)
	})
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/users/1", nil))
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/users/2", nil))
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("DELETE", "/users/2", nil))
	// Output:
	// 9:192.0.2.115:GET /users/{id}
	// 9:192.0.2.115:GET /users/{id}
	// 9:192.0.2.118:DELETE /users/{id}
}
