package main

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	metricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP receiver on loopback: it keeps what the
// service exports, decoded.
type receiver struct {
	url     string
	mu      sync.Mutex
	spans   []map[string]string // each span's attributes, as strings
	rejects int64               // the latest ceiling.rate_limiting.requests total of chat:shop:minute, rejected
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := io.Reader(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/v1/traces":
			var req tracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(b, &req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rc.addSpans(&req)
			b, _ = proto.Marshal(&tracepb.ExportTraceServiceResponse{})
		case "/v1/metrics":
			var req metricspb.ExportMetricsServiceRequest
			if err := proto.Unmarshal(b, &req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rc.addMetrics(&req)
			b, _ = proto.Marshal(&metricspb.ExportMetricsServiceResponse{})
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	rc.url = srv.URL
	return rc
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		}
	}
	return m
}

func (rc *receiver) addSpans(req *tracepb.ExportTraceServiceRequest) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				rc.spans = append(rc.spans, attrMap(s.GetAttributes()))
			}
		}
	}
}

func (rc *receiver) addMetrics(req *metricspb.ExportMetricsServiceRequest) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				if m.GetName() != "ceiling.rate_limiting.requests" {
					continue
				}
				for _, p := range m.GetSum().GetDataPoints() {
					if a := attrMap(p.GetAttributes()); a["ceiling.rate_limiting.rule"] == ruleMinute && a["ceiling.rate_limiting.result"] == "rejected" {
						rc.rejects = max(rc.rejects, p.GetAsInt())
					}
				}
			}
		}
	}
}

// rejectedSpans is how many spans carry a rejection by the minute rule.
func (rc *receiver) rejectedSpans() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, a := range rc.spans {
		if a["ceiling.rate_limiting.result"] == "rejected" && a["ceiling.rate_limiting.rule"] == ruleMinute && a["ceiling.rate_limiting.retry_after"] != "" {
			n++
		}
	}
	return n
}

func (rc *receiver) rejectedCount() int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.rejects
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the binary exports over OTLP: the
// 429 of the 31st chat in a minute arrives as the attributes of its
// request's span and as an increment of the requests counter, while
// GET /metrics still serves Prometheus.
func TestBinaryExportsA429OverOTLP(t *testing.T) {
	rc := newReceiver(t)
	p := servicetest.Start(t, chatBinary.Path(t), []string{
		"CHAT_JWT_SECRET=" + testSecret,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.url,
		"OTEL_METRIC_EXPORT_INTERVAL=100", // ms
		"OTEL_BSP_SCHEDULE_DELAY=100",     // ms
	})
	tok := token(t, "https://otlp.myshopify.com")
	var got []int
	for range 31 {
		r, err := servicetest.Post(http.DefaultClient, p.URL+"/api/chat", tok, question)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Status)
	}
	if got[29] != 200 || got[30] != 429 {
		t.Fatalf("statuses %v, want 30 × 200 then 429", got)
	}
	if !servicetest.Eventually(10*time.Second, func() bool { return rc.rejectedSpans() == 1 && rc.rejectedCount() == 1 }) {
		t.Errorf("the receiver got %d spans rejected by %s and a rejected count of %d, want 1 and 1", rc.rejectedSpans(), ruleMinute, rc.rejectedCount())
	}
	if m, err := servicetest.Get(http.DefaultClient, p.Admin+"/metrics"); err != nil || !strings.Contains(m.Body, `ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="rejected",ceiling_rate_limiting_rule="`+ruleMinute+`"} 1`) {
		t.Errorf("/metrics does not count the rejection in Prometheus' format (%v):\n%s", err, m.Body)
	}
	if strings.Contains(p.Log(), otlpEndpoint+" is not set") {
		t.Errorf("the service says the endpoint is not set:\n%s", p.Log())
	}
	p.Stop(t)
}

// Without OTEL_EXPORTER_OTLP_ENDPOINT the binary exports nothing, and
// says so in one log line.
func TestBinaryWithoutOTLPSaysSoOnce(t *testing.T) {
	p := servicetest.Start(t, chatBinary.Path(t), nil)
	p.Stop(t)
	if n := strings.Count(p.Log(), otlpEndpoint+" is not set"); n != 1 {
		t.Errorf("%d lines say %s is not set, want 1:\n%s", n, otlpEndpoint, p.Log())
	}
}
