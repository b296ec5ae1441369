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
	fivePerUser(t, ts.URL, tok, "+254 700 000 10")
}

// fivePerUser asks for codes to six numbers (prefix followed by 0 to 5)
// with the user's token: 5 are sent, and the otp:user rule refuses the
// sixth.
func fivePerUser(t *testing.T, url, tok, prefix string) {
	t.Helper()
	var got []int
	var last servicetest.Response
	for i := range 6 {
		last = otp(t, url, tok, phone(prefix+string(rune('0'+i))))
		got = append(got, last.Status)
	}
	if want := []int{202, 202, 202, 202, 202, 429}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if got, want := violated(t, last), []string{ruleUser}; !slices.Equal(got, want) {
		t.Errorf("violated policies %v, want %v: the token names no user", got, want)
	}
}
