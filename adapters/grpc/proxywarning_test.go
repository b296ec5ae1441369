package ceilinggrpc_test

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
)

// proxyWarningChild is set in the environment of the test binary that
// TestPeerAddrWarnsOfAnUntrustedProxyRegression runs: the warning is once
// per process, so it is watched in a process of its own.
const proxyWarningChild = "CEILINGGRPC_PROXY_WARNING_CHILD"

// A private-range peer whose calls carry x-forwarded-for is a proxy left
// out of the configuration: PeerAddr (and ClientIP without options) says so
// once per process, in the log and in Health().Warnings, as the HTTP
// RemoteAddr does. PeerAddr stopped reading any entry and the warning was
// never raised. A public peer's entry is the client's own and is no sign.
func TestPeerAddrWarnsOfAnUntrustedProxyRegression(t *testing.T) {
	if os.Getenv(proxyWarningChild) == "" {
		child := exec.Command(os.Args[0], "-test.run=^TestPeerAddrWarnsOfAnUntrustedProxyRegression$", "-test.count=1", "-test.v")
		child.Env = append(os.Environ(), proxyWarningChild+"=1")
		if out, err := child.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("in a process of its own: %v\n%s", err, out)
		}
		return
	}
	var log bytes.Buffer
	// The first limiter of a process is where process-wide warnings go.
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Limit: 100, Period: time.Minute}},
		ceiling.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	t.Cleanup(func() { l.Close() })
	g := ceilinggrpc.MustNew(l, []ceilinggrpc.Rule{{Name: "ip", Key: ceilinggrpc.MustClientIP()}})
	s := serveLimiter(t, g)

	if err := s.check(t, testPeer, "203.0.113.5:4711", "x-forwarded-for", "198.51.100.1"); err != nil {
		t.Fatal(err)
	}
	if w := l.Health().Warnings; len(w) != 0 {
		t.Fatalf("after a public peer's x-forwarded-for: warnings %q, want none", w)
	}
	for range 3 {
		if err := s.check(t, testPeer, "10.1.2.3:4711", "x-forwarded-for", "203.0.113.9"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ceilinggrpc.PeerAddr(callCtx("192.168.1.1:80", "forwarded", "for=203.0.113.7"), checkMethod); err != nil {
		t.Fatal(err)
	}
	w := l.Health().Warnings
	if len(w) != 1 || !strings.Contains(w[0], "carry X-Forwarded-For, but the client-address key trusts no proxy") {
		t.Errorf("Health().Warnings = %q, want the one warning of an untrusted proxy", w)
	}
	if got := strings.Count(log.String(), "carry X-Forwarded-For, but the client-address key trusts no proxy"); got != 1 ||
		!strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "peer=10.1.2.3") {
		t.Errorf("log %q: want one warning naming the peer 10.1.2.3", log.String())
	}
}
