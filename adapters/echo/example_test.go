package ceilingecho_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingecho "github.com/ceiling-go/ceiling/adapters/echo"
	"github.com/labstack/echo/v4"
)

// Limit an OTP endpoint: 2 per hour per destination phone number (read from
// the JSON body, which the handler still reads in full) and 3 per hour per
// client address, which a client cannot change by sending X-Forwarded-For.
func Example() {
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:phone", Key: ceiling.Must(ceiling.BodyField("phone")), Limit: 2, Period: time.Hour, Algorithm: ceiling.SlidingLog},
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: ceiling.SlidingLog},
	})

	e := echo.New()
	e.Use(ceilingecho.Middleware(limiter))
	e.POST("/otp", func(c echo.Context) error {
		var body struct{ Phone string }
		if err := c.Bind(&body); err != nil {
			return err
		}
		return c.String(http.StatusOK, "code sent to "+body.Phone)
	})

	send := func(phone, xff string) {
		r := httptest.NewRequest("POST", "/otp", strings.NewReader(`{"phone":"`+phone+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			fmt.Println(w.Code, "Retry-After:", w.Header().Get("Retry-After"), "RateLimit:", w.Header().Get("RateLimit"))
			return
		}
		fmt.Println(w.Code, w.Body)
	}
	send("+254700000001", "198.51.100.1")
	send("+254700000001", "198.51.100.2")
	send("+254700000001", "198.51.100.3") // the phone's budget is spent
	send("+254700000002", "198.51.100.4")
	send("+254700000003", "198.51.100.5") // the address's budget is spent
	// Output:
	// 200 code sent to +254700000001
	// 200 code sent to +254700000001
	// 429 Retry-After: 3600 RateLimit: "otp:phone";r=0;t=3600
	// 200 code sent to +254700000002
	// 429 Retry-After: 3600 RateLimit: "otp:ip";r=0;t=3600
}

// Opting in to Echo's idea of the client address is safe only with an
// extractor that trusts exactly your proxies, here 10.0.0.0/24.
func ExampleFrameworkRealIP() {
	_, proxies, _ := net.ParseCIDR("10.0.0.0/24")
	e := echo.New()
	e.IPExtractor = echo.ExtractIPFromXFFHeader(
		echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false),
		echo.TrustIPRange(proxies))
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceilingecho.FrameworkRealIP, Limit: 1, Period: time.Minute},
	})
	e.Use(ceilingecho.Middleware(limiter))
	e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, c.RealIP()) })

	get := func(peer, xff string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			fmt.Println(w.Code)
			return
		}
		fmt.Println(w.Code, "keyed by", w.Body)
	}
	get("10.0.0.2:4711", "203.0.113.7")   // a client behind the proxy
	get("10.0.0.2:4711", "203.0.113.8")   // another one
	get("10.0.0.2:4711", "203.0.113.7")   // the first again
	get("192.0.2.1:4711", "198.51.100.1") // no proxy: the header is ignored
	get("192.0.2.1:4711", "198.51.100.2") // so it buys nothing
	// Output:
	// 200 keyed by 203.0.113.7
	// 200 keyed by 203.0.113.8
	// 429
	// 200 keyed by 192.0.2.1
	// 429
}

// A key function can read what only Echo knows through [ceilingecho.Context]:
// here the :shop path parameter, one budget per shop.
func ExampleContext() {
	shop := func(r *http.Request) (string, error) {
		c := ceilingecho.Context(r)
		if c == nil {
			return "", errors.New("shop key used outside ceilingecho.Middleware")
		}
		return c.Param("shop"), nil
	}
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:shop", Key: shop, Limit: 1, Period: time.Minute},
	})
	e := echo.New()
	e.POST("/shops/:shop/chat", func(c echo.Context) error {
		return c.String(http.StatusOK, "reply for "+c.Param("shop"))
	}, ceilingecho.Middleware(limiter))

	for _, path := range []string{"/shops/a/chat", "/shops/b/chat", "/shops/a/chat"} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest("POST", path, nil))
		fmt.Println(path, w.Code)
	}
	// Output:
	// /shops/a/chat 200
	// /shops/b/chat 200
	// /shops/a/chat 429
}
