package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/cputime"
)

// BenchmarkMiddleware is a whole request through each library's middleware
// over a handler that does nothing (httptest, no network): one client, and
// 100k clients serial and from every core. The rows bare and echo-bare are
// the frameworks alone; a middleware's overhead is its time minus its base.
func BenchmarkMiddleware(top *testing.B) {
	for _, v := range []struct {
		clients  int
		parallel bool
	}{{1, false}, {100_000, false}, {100_000, true}} {
		as := addrs(v.clients)
		mode := "serial"
		if v.parallel {
			mode = "parallel"
		}
		for _, lib := range append(append([]httpLib(nil), httpBases...), httpLibs...) {
			top.Run(fmt.Sprintf("clients=%s/%s/%s", count(v.clients), mode, lib.name), func(b *testing.B) {
				h := setup(b, top, func() http.Handler {
					if lib.base != "" {
						checkHTTP(b, lib, as)
					}
					h := lib.new(huge, time.Minute)
					for _, a := range as {
						if code := serve(h, a); code != http.StatusOK {
							b.Fatalf("filling %s: %s got %d", lib.name, a, code)
						}
					}
					return h
				})
				if v.parallel {
					serveParallel(b, h, as)
				} else {
					serveSerial(b, h, as)
				}
			})
		}
	}
}

func serveSerial(b *testing.B, h http.Handler, as []string) {
	r := httptest.NewRequest("GET", "/", nil)
	w := newSink()
	ok, i := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Now()
	for range b.N {
		w.reset()
		r.RemoteAddr = as[i]
		h.ServeHTTP(w, r)
		if w.code == 0 {
			ok++
		}
		if i++; i == len(as) {
			i = 0
		}
	}
	b.StopTimer()
	cputime.Report(b, cpu)
	if ok != b.N {
		b.Fatalf("%d of %d timed requests were answered with a status: the benchmark timed rejections", b.N-ok, b.N)
	}
}

func serveParallel(b *testing.B, h http.Handler, as []string) {
	var admitted, start atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Now()
	b.RunParallel(func(pb *testing.PB) {
		r := httptest.NewRequest("GET", "/", nil)
		w := newSink()
		i := int(start.Add(7919)) % len(as)
		n := int64(0)
		for pb.Next() {
			w.reset()
			r.RemoteAddr = as[i]
			h.ServeHTTP(w, r)
			if w.code == 0 {
				n++
			}
			if i++; i == len(as) {
				i = 0
			}
		}
		admitted.Add(n)
	})
	b.StopTimer()
	cputime.Report(b, cpu)
	if got := admitted.Load(); got != int64(b.N) {
		b.Fatalf("%d of %d timed requests were answered with a status: the benchmark timed rejections", int64(b.N)-got, b.N)
	}
}
