package ceiling_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/go-chi/chi/v5"
)

// chi (v5.5.0 and later) sets r.Pattern once it has routed, so a limiter
// mounted on the route keys on the route's pattern with nothing more:
// /orders/1 and /orders/2 share one budget.
func ExampleRoute_chi() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "route", Key: ceiling.Join(ceiling.RemoteAddr, ceiling.Route), Limit: 1, Period: time.Minute,
	}})
	defer limiter.Close()
	router := chi.NewRouter()
	router.With(limiter.Handler).Get("/orders/{id}", func(http.ResponseWriter, *http.Request) {})
	for _, target := range []string{"/orders/1", "/orders/2"} {
		w := httptest.NewRecorder()
		router.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		fmt.Println(target, w.Code)
	}
	// Output:
	// /orders/1 200
	// /orders/2 429
}

// A router that knows the template of the route it matched but does not
// set r.Pattern hands it to ceiling with WithRoute, before the limiter.
func ExampleWithRoute() {
	limiter := ceiling.MustNew([]ceiling.Rule{{
		Name: "route", Key: ceiling.Join(ceiling.RemoteAddr, ceiling.Route), Limit: 1, Period: time.Minute,
	}})
	defer limiter.Close()
	orders := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	router := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := strings.CutPrefix(r.URL.Path, "/orders/"); ok && id != "" {
			orders.ServeHTTP(w, ceiling.WithRoute(r, "/orders/{id}"))
			return
		}
		http.NotFound(w, r)
	})
	for _, target := range []string{"/orders/1", "/orders/2"} {
		w := httptest.NewRecorder()
		router.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		fmt.Println(target, w.Code)
	}
	// Output:
	// /orders/1 200
	// /orders/2 429
}
