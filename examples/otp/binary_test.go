package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

// GET /healthz and GET /metrics are served on the admin listener, and
// the public one answers them 404 (issue 23.13).
func TestAdminEndpointsStayOffThePublicListener(t *testing.T) {
	p := servicetest.Start(t, otpBinary.Path(t), nil)
	servicetest.AdminOnly(t, p)
	p.Stop(t)
}

// The admin listener stays the operator's: an empty -admin is refused at
// start, one that binds every interface (-admin :0, 0.0.0.0, [::] or
// ADMIN_ADDR=:0) is logged as a warning, and on loopback it answers only
// requests addressed to a loopback name, not a rebound DNS name.
func TestAdminAddressIsLoopbackOrWarned(t *testing.T) {
	servicetest.AdminAddresses(t, otpBinary.Path(t), nil)
}

// The real binary as `go run ./examples/otp` starts it on a fresh machine:
// it warns that limits are per process, sends (fakes) a code, limits the
// number, and shuts down cleanly on SIGTERM.
func TestBinaryStartsLimitsAndStops(t *testing.T) {
	p := servicetest.Start(t, otpBinary.Path(t), nil)
	if !strings.Contains(p.Log(), "EVERY INSTANCE ENFORCES ITS OWN LIMITS") {
		t.Errorf("start-up log lacks the per-process warning:\n%s", p.Log())
	}
	var got []int
	for range 4 {
		resp, err := servicetest.Post(http.DefaultClient, p.URL+"/api/otp", "", phone(kenya))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.Status)
	}
	if want := []int{202, 202, 202, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if !strings.Contains(p.Log(), "to=+254*******00") {
		t.Errorf("the fake sender did not log the masked number:\n%s", p.Log())
	}
	resp, err := servicetest.Get(http.DefaultClient, p.Admin+"/metrics")
	if err != nil || !strings.Contains(resp.Body, `ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result="rejected",ceiling_rate_limiting_rule="otp:phone"} 1`) {
		t.Errorf("/metrics does not count the rejection: %v\n%s", err, resp.Body)
	}
	p.Stop(t)
}
