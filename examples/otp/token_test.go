package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

// -mint-token prints a token the service accepts as the user's, signed
// with OTP_JWT_SECRET: the otp:user rule counts it.
func TestMintTokenNamesAUserTheServiceCounts(t *testing.T) {
	var stdout, stderr strings.Builder
	env := func(k string) string { return map[string]string{"OTP_JWT_SECRET": testSecret}[k] }
	if err := run(context.Background(), []string{"-mint-token", "alice"}, env, &stdout, &stderr); err != nil {
		t.Fatalf("-mint-token: %v\n%s", err, stderr.String())
	}
	tok := strings.TrimSpace(stdout.String())
	cfg, _ := testConfig(t)
	ts := start(t, cfg)
	var got []int
	var last servicetest.Response
	for i := range 6 {
		last = otp(t, ts.URL, tok, phone("+254 700 000 10"+string(rune('0'+i))))
		got = append(got, last.Status)
	}
	if want := []int{202, 202, 202, 202, 202, 429}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if got, want := violated(t, last), []string{ruleUser}; !slices.Equal(got, want) {
		t.Errorf("violated policies %v, want %v: the minted token names no user", got, want)
	}
}
