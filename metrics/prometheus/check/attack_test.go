package check_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// redisSpans is the text of every span, attribute, event and status, that
// go-redis' tracing with opts records for requests through a limiter on a
// real Redis with a password, while it answers and after it died; and the
// server's address, password and the stored keys' prefix.
func redisSpans(t *testing.T, opts ...redisotel.TracingOption) (text, addr, password, prefix string) {
	t.Helper()
	password = "pw-Zq81vXk2Lm"
	srv := redistest.ServerWith(t, "requirepass "+password)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	if err := redisotel.InstrumentTracing(client, append([]redisotel.TracingOption{redisotel.WithTracerProvider(tp)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	prefix = redistest.KeyPrefix(t)
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:ip", Key: ceiling.RemoteAddr, Limit: 2, Period: time.Minute},
	}, ceiling.WithBackend(redisbackend.New(client, redisbackend.WithPrefix(prefix))),
		ceiling.WithTimeout(100*time.Millisecond), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	tracer := tp.Tracer("test")
	send := func() {
		ctx, span := tracer.Start(context.Background(), "request")
		defer span.End()
		r := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
		r.RemoteAddr = "198.51.100.23:5555"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	for range 3 {
		send()
	}
	srv.Kill()
	for range 3 {
		send()
	}
	var b strings.Builder
	add := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			fmt.Fprintf(&b, "%s %s=%s\n", where, kv.Key, kv.Value.Emit())
		}
	}
	n := 0
	for _, s := range spans.Ended() {
		if name := s.Name(); strings.HasPrefix(name, "fcall") || strings.HasPrefix(name, "eval") {
			n++
		}
		add("span "+s.Name(), s.Attributes())
		for _, e := range s.Events() {
			add("span "+s.Name()+" event "+e.Name, e.Attributes)
		}
		fmt.Fprintf(&b, "span %s status %s\n", s.Name(), s.Status().Description)
	}
	if n == 0 {
		t.Fatal("no span of a decision's FCALL, EVAL or EVALSHA recorded")
	}
	return b.String(), srv.Addr, password, prefix
}

// The Redis spans that metrics/otel's README has the reader turn on
// (redisotel.InstrumentTracing) must not repeat the stored keys: a key's
// digest names one client for good, across requests and instances. With
// go-redis' defaults each FCALL's db.statement holds them all, so the
// README turns the statement off; and with it off, no span holds a key or
// the password.
func TestREADMERedisSpansHoldNoStoredKey_Attack(t *testing.T) {
	readme, err := os.ReadFile("../../otel/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if text, _, _, prefix := redisSpans(t); !strings.Contains(text, prefix) {
		t.Fatalf("go-redis' default spans hold no stored key: the README need not turn the statement off\n%s", text)
	}
	if !strings.Contains(string(readme), "redisotel.WithDBStatement(false)") {
		t.Error("metrics/otel/README.md instruments the client without redisotel.WithDBStatement(false): every decision's span repeats the stored keys")
	}
	text, _, password, prefix := redisSpans(t, redisotel.WithDBStatement(false))
	for _, leak := range []string{prefix, password, "198.51.100.23"} {
		if strings.Contains(text, leak) {
			t.Errorf("a Redis span repeats %q\n%s", leak, text)
		}
	}
}

// Nor should they name the Redis server; but go-redis' tracing sets
// db.connection_string, server.address and server.port on every span, and
// a failed dial's error text repeats the address, whatever the options.
func TestREADMERedisSpansNameNoAddress_Attack(t *testing.T) {
	t.Skip("defect: redisotel puts the Redis address in db.connection_string, server.address/port and dial errors on every span, with no option to leave it out; the README says so and shows how to drop it at the exporter")
	text, addr, _, _ := redisSpans(t, redisotel.WithDBStatement(false))
	if strings.Contains(text, addr) {
		t.Errorf("a Redis span repeats the Redis address %s\n%s", addr, text)
	}
}

// requestCounts is the requests counter of g by rule and result,
// "rule/result", from series.
func requestCounts(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range series(t, g) {
		rest, ok := strings.CutPrefix(s, "ceiling_rate_limiting_requests_total{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		var result, rule string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "ceiling_rate_limiting_result":
				result = v
			case "ceiling_rate_limiting_rule":
				rule = v
			}
		}
		var f float64
		fmt.Sscan(value, &f)
		if f != 0 {
			out[rule+"/"+result] = f
		}
	}
	return out
}

// Through a real Redis that answers, is frozen, thawed, killed and
// restarted empty, every response a client sees is counted, once, and
// alike by both exporters: each 200 once per rule that applied as an
// admission (allowed, or a fail mode's), each 429 once per rule that
// applied as a refusal or not charged, each 503 once, as fail_closed or
// shed, on one rule.
func TestEveryResponseCountedOnceByBothExporters_Attack(t *testing.T) {
	srv := redistest.Server(t)
	prom := ceilingprom.New(ceilingprom.Options{})
	promReg := prometheus.NewPedanticRegistry()
	promReg.MustRegister(prom)
	otelReg := prometheus.NewPedanticRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(otelReg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	otel, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute, FailMode: ceiling.FailLocal},
		{Name: "to", Key: ceiling.Query("to"), Limit: 2, Period: time.Hour, FailMode: ceiling.FailClosed},
	}, ceiling.WithBackend(redisbackend.New(client, redisbackend.WithPrefix(redistest.KeyPrefix(t)))),
		ceiling.WithObserver(prom), ceiling.WithObserver(otel),
		ceiling.WithTimeout(50*time.Millisecond), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	want := map[string]float64{}
	codes := map[int]int{}
	n := 0
	send := func() {
		n++
		target := "/"
		to := n%2 == 0
		if to {
			target = "/?to=" + fmt.Sprint(n%3)
		}
		r := httptest.NewRequest("GET", target, nil)
		r.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", n%4)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes[w.Code]++
		switch w.Code {
		case 200:
			want["ip/200"]++
			if to {
				want["to/200"]++
			}
		case 429:
			want["ip/429"]++
			if to {
				want["to/429"]++
			}
		case 503:
			want["503"]++
		default:
			t.Errorf("request %d: status %d", n, w.Code)
		}
	}
	phases := []struct {
		name string
		do   func()
	}{
		{"up", func() {}},
		{"frozen", func() { srv.Freeze(t) }},
		{"thawed", func() { srv.Thaw(t) }},
		{"killed", srv.Kill},
		{"restarted", func() { srv.Restart(t) }},
	}
	for _, p := range phases {
		p.do()
		for range 12 {
			send()
		}
	}
	for _, c := range []int{200, 429, 503} {
		if codes[c] == 0 {
			t.Fatalf("no %d among %v: the scenario misses an outcome", c, codes)
		}
	}
	for name, g := range map[string]prometheus.Gatherer{"ceilingprom": promReg, "ceilingotel": otelReg} {
		got := requestCounts(t, g)
		folded := map[string]float64{}
		for k, v := range got {
			rule, result, _ := strings.Cut(k, "/")
			switch result {
			case "allowed", "fail_local", "fail_open":
				folded[rule+"/200"] += v
			case "rejected", "not_charged":
				folded[rule+"/429"] += v
			case "fail_closed", "shed":
				folded["503"] += v
			default:
				folded[k] += v
			}
		}
		for k, v := range want {
			if folded[k] != v {
				t.Errorf("%s: %s = %v, want %v (responses %v)", name, k, folded[k], v, codes)
			}
		}
		for k, v := range folded {
			if _, ok := want[k]; !ok {
				t.Errorf("%s: %s = %v, no response for it (responses %v)", name, k, v, codes)
			}
		}
	}
}
