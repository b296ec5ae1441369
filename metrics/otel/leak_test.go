package ceilingotel_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Nothing the observer exports, every instrument's name and attributes and
// every attribute, event and status of the requests' spans, repeats a key
// value, the Redis address or password, the key secret or the stored keys'
// prefix, after requests with distinctive keys were admitted, rejected,
// refused by a shadow rule and, with the real Redis killed, decided by
// every fail mode and refused failing closed.
func TestExportsHoldNoKeyAddressOrSecret(t *testing.T) {
	const password = "pw-Zq81vXk2Lm"
	secret := []byte("ks-7HcP0qW3nR5tY9uI2oA4sD6fG8hJ1kL3")
	srv := redistest.ServerWith(t, "requirepass "+password)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat:ip", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Minute, FailMode: ceiling.FailLocal},
		{Name: "chat:user", Key: ceiling.Header("X-User"), Limit: 2, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "otp:to", Key: ceiling.Query("to"), Limit: 1, Period: time.Hour, FailMode: ceiling.FailClosed},
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute, Shadow: true},
	}, ceiling.WithBackend(redisbackend.New(client, redisbackend.WithPrefix(prefix))),
		ceiling.WithKeySecret(secret), ceiling.WithObserver(obs), ceiling.WithTimeout(2*time.Second), quiet)
	t.Cleanup(func() { l.Close() })
	h, spans := traced(t, l.Handler(ok))

	codes := map[int]int{}
	send := func(addr, user, to string) {
		r := httptest.NewRequest("GET", "/?to="+to, nil)
		r.RemoteAddr = addr
		if user != "" {
			r.Header.Set("X-User", user)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes[w.Code]++
	}
	for range 4 {
		send("198.51.100.23:5555", "user-4f9c1e", "%2B15550199123")
		send("[2001:db8:77::beef]:443", "mallory-b7e2", "%2B15550188456")
	}
	srv.Kill()
	// Keys the deny cache does not hold as spent, so that the backend is
	// asked, fails, and the fail modes decide.
	for _, c := range [][3]string{
		{"198.51.100.23:5555", "user-a11ce9", "%2B15550177789"}, // otp:to fails closed: 503
		{"203.0.113.9:1", "", ""},                               // only chat:ip and new apply: decided locally
		{"203.0.113.9:1", "trudy-c0ffee", ""},
	} {
		for range 3 {
			send(c[0], c[1], c[2])
		}
	}
	for _, code := range []int{200, 429, 503} {
		if codes[code] == 0 {
			t.Fatalf("no %d among the responses %v: the scenario does not reach every outcome", code, codes)
		}
	}

	var exported strings.Builder // everything exported, as text
	add := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			fmt.Fprintf(&exported, "%s %s=%s\n", where, kv.Key, kv.Value.Emit())
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(&exported, "%s %s %s\n", m.Name, m.Unit, m.Description)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes.ToSlice())
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes.ToSlice())
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes.ToSlice())
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes.ToSlice())
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	for _, s := range spans.Ended() {
		add("span", s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&exported, "span event %s\n", e.Name)
			add("span event", e.Attributes)
		}
		fmt.Fprintf(&exported, "span status %s\n", s.Status().Description)
	}
	text := exported.String()
	for _, want := range []string{"result=rejected", "result=fail_closed", "result=shadow_rejected", "span ceiling.rate_limiting.result=fail_closed"} {
		if !strings.Contains(text, want) {
			t.Fatalf("nothing exported says %s: the scenario did not reach it\n%s", want, text)
		}
	}
	for _, leak := range []string{
		"198.51.100.23", "2001:db8", "user-4f9c1e", "mallory-b7e2", "user-a11ce9", "trudy-c0ffee",
		"15550199123", "15550188456", "15550177789", "203.0.113.9",
		srv.Addr, password, string(secret), hex.EncodeToString(secret), prefix,
	} {
		if strings.Contains(text, leak) {
			t.Errorf("the export repeats %q", leak)
		}
	}
	if t.Failed() {
		t.Logf("exported:\n%s", text)
	}
}
