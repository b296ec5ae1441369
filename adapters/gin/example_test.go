package ceilinggin_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggin "github.com/ceiling-go/ceiling/adapters/gin"
	"github.com/gin-gonic/gin"
)

// Limit an OTP endpoint: 2 per hour per destination phone number (read from
// the JSON body, which the handler still reads in full) and 3 per hour per
// client address, which a client cannot change by sending X-Forwarded-For.
func Example() {
	gin.SetMode(gin.ReleaseMode) // no route-table banner on stdout
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:phone", Key: ceiling.Must(ceiling.BodyField("phone")), Limit: 2, Period: time.Hour, Algorithm: ceiling.SlidingLog},
		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Hour, Algorithm: ceiling.SlidingLog},
	})

	router := gin.New()
	router.Use(ceilinggin.Middleware(limiter))
	router.POST("/otp", func(c *gin.Context) {
		var body struct{ Phone string }
		if err := c.BindJSON(&body); err != nil {
			return
		}
		c.String(http.StatusOK, "code sent to "+body.Phone)
	})

	send := func(phone, xff string) {
		r := httptest.NewRequest("POST", "/otp", strings.NewReader(`{"phone":"`+phone+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		router.ServeHTTP(w, r)
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

// Opting in to Gin's idea of the client address is safe only once the engine
// trusts exactly your proxies, here 10.0.0.0/24: by default it trusts every
// peer, and anybody can name their own address.
func ExampleFrameworkClientIP() {
	gin.SetMode(gin.ReleaseMode)
	router := gin.New()
	if err := router.SetTrustedProxies([]string{"10.0.0.0/24"}); err != nil {
		panic(err)
	}
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceilinggin.FrameworkClientIP, Limit: 1, Period: time.Minute},
	})
	router.Use(ceilinggin.Middleware(limiter))
	router.GET("/", func(c *gin.Context) { c.String(http.StatusOK, c.ClientIP()) })

	get := func(peer, xff string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		router.ServeHTTP(w, r)
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

// A key function can read what only Gin knows through [ceilinggin.Context]:
// here the :shop path parameter, one budget per shop.
func ExampleContext() {
	gin.SetMode(gin.ReleaseMode)
	shop := func(r *http.Request) (string, error) {
		c := ceilinggin.Context(r)
		if c == nil {
			return "", errors.New("shop key used outside ceilinggin.Middleware")
		}
		return c.Param("shop"), nil
	}
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:shop", Key: shop, Limit: 1, Period: time.Minute},
	})
	router := gin.New()
	router.POST("/shops/:shop/chat", ceilinggin.Middleware(limiter), func(c *gin.Context) {
		c.String(http.StatusOK, "reply for "+c.Param("shop"))
	})

	for _, path := range []string{"/shops/a/chat", "/shops/b/chat", "/shops/a/chat"} {
		w := httptest.NewRecorder()
		router.ServeHTTP(w, httptest.NewRequest("POST", path, nil))
		fmt.Println(path, w.Code)
	}
	// Output:
	// /shops/a/chat 200
	// /shops/b/chat 200
	// /shops/a/chat 429
}
