package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

// The spans the service exports carry no client address: the address is
// the chat:ip rule's key value, and the collector is a third party's as
// often as not. Nor does a span repeat an X-Forwarded-For the service
// does not trust (no TRUSTED_PROXIES here), which would name whatever
// address a client chose.
func TestExportedSpansCarryNoAddress_Attack(t *testing.T) {
	rc := newReceiver(t)
	p := servicetest.Start(t, chatBinary.Path(t), []string{
		"CHAT_JWT_SECRET=" + testSecret,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.url,
		"OTEL_METRIC_EXPORT_INTERVAL=100", // ms
		"OTEL_BSP_SCHEDULE_DELAY=100",     // ms
	})
	tok := token(t, "https://otlp.myshopify.com")
	if _, err := servicetest.Post(http.DefaultClient, p.URL+"/api/chat", tok, question, "X-Forwarded-For: 203.0.113.9"); err != nil {
		t.Fatal(err)
	}
	if !servicetest.Eventually(10*time.Second, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.spans) > 0 }) {
		t.Fatal("no span exported")
	}
	p.Stop(t)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, a := range rc.spans {
		for k, v := range a {
			if k == "client.address" || k == "network.peer.address" || k == "network.peer.port" || strings.Contains(v, "203.0.113.9") {
				t.Errorf("span attribute %s=%q names the client's address", k, v)
			}
		}
	}
}
