package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/golang-jwt/jwt/v5"
)

const kenya = "+254 700 000 000"

// The check that catches a limiter that is not atomic: 30 requests for one
// number, 10 at a time, and exactly 3 codes go out.
func TestParallelRequestsForOnePhoneSendExactlyThree(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, sms *countingSender) {
		ts := start(t, cfg)
		got, err := servicetest.Parallel(30, 10, func(int) (int, error) {
			r, err := servicetest.Post(http.DefaultClient, ts.URL+"/api/otp", "", phone(kenya))
			return r.Status, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got[202] != 3 || got[429] != 27 {
			t.Errorf("statuses %v, want 3 × 202 and 27 × 429", got)
		}
		if got, want := sms.count(), 3; got != want {
			t.Errorf("%d SMS sent, want %d", got, want)
		}
	})
}

func TestSpellingsOfOneNumberShareItsBudget(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, sms *countingSender) {
		cfg.Region = "KE"
		ts := start(t, cfg)
		var got []int
		var last servicetest.Response
		for _, n := range []string{"+254 700 000 000", "254700000000", "+254-700-000-000", "(254) 700.000.000", "0700 000 000", "+２５４ 700 000 000"} {
			last = otp(t, ts.URL, "", phone(n))
			got = append(got, last.Status)
		}
		if want := []int{202, 202, 202, 429, 429, 429}; !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if got, want := violated(t, last), []string{rulePhone}; !slices.Equal(got, want) {
			t.Errorf("violated policies %v, want %v", got, want)
		}
		if last.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
		if got, want := sms.sent, []string{"+254700000000", "+254700000000", "+254700000000"}; !slices.Equal(got, want) {
			t.Errorf("sent to %v, want %v", got, want)
		}
	})
}

// TestOneHandsetIsOneKey pins issue 14's fourth finding with its spellings:
// international, with the 00 prefix, with the trunk "(0)", and two that
// are no number at all. One handset gets 3 codes in total, not 3 per
// spelling, and every code goes to its E.164 form. The issue's own number,
// in the UK's fictional 07700 900xxx range, reaches nobody and is refused.
func TestOneHandsetIsOneKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, sms *countingSender) {
		cfg.Region = "GB"
		cfg.Limits.PerIP = 100
		ts := start(t, cfg)
		got := map[int]int{}
		for range 3 {
			for _, n := range []string{"+44 7400 900777", "0044 7400 900777", "+44 (0)7400 900777", "00044 7400 900777", "+0447400900777", "07400 900777"} {
				got[otp(t, ts.URL, "", phone(n)).Status]++
			}
		}
		if got[202] != 3 || got[429] != 9 || got[400] != 6 {
			t.Errorf("statuses %v, want 3 × 202, 9 × 429 and 6 × 400 (00044 and +044 are no number)", got)
		}
		if got, want := sms.sent, []string{"+447400900777", "+447400900777", "+447400900777"}; !slices.Equal(got, want) {
			t.Errorf("sent to %v, want %v", got, want)
		}
		for _, n := range []string{"+44 7700 900777", "0044 7700 900777", "+44 (0)7700 900777", "00044 7700 900777", "+0447700900777"} {
			if r := otp(t, ts.URL, "", phone(n)); r.Status != 400 {
				t.Errorf("%s (fictional): %d %s, want 400", n, r.Status, r.Body)
			}
		}
		if n := sms.count(); n != 3 {
			t.Errorf("%d SMS sent in all, want 3", n)
		}
	})
}

// Without OTP_DEFAULT_REGION only international numbers are accepted; with
// one, national numbers are read in it; an unknown region stops the start.
func TestDefaultRegion(t *testing.T) {
	cfg, _ := testConfig(t)
	ts := start(t, cfg)
	if r := otp(t, ts.URL, "", phone("0700 000 000")); r.Status != 400 || !strings.Contains(r.Body, "country code") {
		t.Errorf("a national number without a region: %d %s, want 400 asking for the country code", r.Status, r.Body)
	}
	cfg.Region = "KE"
	if r := otp(t, start(t, cfg).URL, "", phone("0700 000 000")); r.Status != 202 {
		t.Errorf("a national number in KE: %d %s, want 202", r.Status, r.Body)
	}
	cfg.Region = "XX"
	if _, _, err := newServer(cfg); err == nil || !strings.Contains(err.Error(), "OTP_DEFAULT_REGION") {
		t.Errorf("region XX: err %v, want one naming OTP_DEFAULT_REGION", err)
	}
}

// Bad input is refused before the limiter asks the backend: it sends
// nothing and spends nothing.
func TestBadInputIsRefusedAndCountsForNothing(t *testing.T) {
	cfg, sms := testConfig(t)
	ts := start(t, cfg)
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"malformed JSON", `{"phone": `, 400},
		{"not an object", `"+254 700 000 000"`, 400},
		{"empty body", ``, 400},
		{"no phone", `{"number": "+254 700 000 000"}`, 400},
		{"empty phone", `{"phone": ""}`, 400},
		{"letters", `{"phone": "+254 7OO OOO OOO"}`, 400},
		{"a vanity number", `{"phone": "+1 800 FLOWERS"}`, 400},
		{"too short", `{"phone": "+254 700"}`, 400},
		{"too long", `{"phone": "+254 700 000 000 000 000"}`, 400},
		{"no country code", `{"phone": "0700 000 000"}`, 400},
		{"an extension", `{"phone": "+254 700 000 000 ext. 12"}`, 400},
		{"a number", `{"phone": 254700000000}`, 400},
		{"phone twice", `{"phone": "+254 700 000 000", "Phone": "+254 700 000 001"}`, 400},
		{"phone an object", `{"phone": {"number": "+254 700 000 000"}}`, 400},
		{"phone a list", `{"phone": ["+254 700 000 000"]}`, 400},
		{"over 1 KiB", `{"phone": "+254 700 000 000", "pad": "` + strings.Repeat("x", 1024) + `"}`, 413},
	} {
		for range 4 {
			resp := otp(t, ts.URL, "", tc.body)
			if resp.Status != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: %d %s %s, want %d problem+json", tc.name, resp.Status, resp.Header.Get("Content-Type"), resp.Body, tc.status)
			}
		}
	}
	if got := sms.count(); got != 0 {
		t.Errorf("%d SMS sent for bad input", got)
	}
	got := []int{}
	for range 4 {
		got = append(got, otp(t, ts.URL, "", phone(kenya)).Status)
	}
	if want := []int{202, 202, 202, 429}; !slices.Equal(got, want) {
		t.Errorf("valid requests after 40 bad ones: %v, want %v", got, want)
	}
}

func TestAcceptedAnswerAndMaskedLog(t *testing.T) {
	cfg, _ := testConfig(t)
	logs := &servicetest.LogBuffer{}
	cfg.Sender = nil // the logging fake
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ts := start(t, cfg)
	resp := otp(t, ts.URL, "", phone("+254 700 000 012"))
	if resp.Status != 202 || strings.TrimSpace(resp.Body) != `{"status":"sent"}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("%d %q, want 202 {\"status\":\"sent\"}", resp.Status, resp.Body)
	}
	if log := logs.String(); !strings.Contains(log, "to=+254*******12") || strings.Contains(log, "254700000012") {
		t.Errorf("the fake sender must log the masked number only:\n%s", log)
	}
}

// A signed-in user gets 5 codes an hour whatever numbers they ask for; a
// token that does not verify names nobody.
func TestSignedInUserGetsFivePerHour(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, sms *countingSender) {
		ts := start(t, cfg)
		alice := servicetest.Token(t, testSecret, jwt.MapClaims{"sub": "alice"})
		fivePerUser(t, ts.URL, alice, "+254 700 000 01")
		bob := servicetest.Token(t, testSecret, jwt.MapClaims{"sub": "bob"})
		if got := otp(t, ts.URL, bob, phone("+254 700 000 020")).Status; got != 202 {
			t.Errorf("bob: %d, want 202 (his own budget)", got)
		}
		forged := servicetest.Token(t, "not-the-secret", jwt.MapClaims{"sub": "alice"})
		if got := otp(t, ts.URL, forged, phone("+254 700 000 021")).Status; got != 202 {
			t.Errorf("forged alice: %d, want 202 (an anonymous caller, not alice)", got)
		}
	})
}

// Behind trusted proxies each client address has its own budget; a client
// that reaches the service directly cannot choose its address.
func TestClientAddressRule(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Limits.PerIP = 2
	cfg.TrustedProxies = []string{"127.0.0.1/32"}
	ts := start(t, cfg)
	a, b := "X-Forwarded-For: 198.51.100.7", "X-Forwarded-For: 198.51.100.8"
	got := []int{
		otp(t, ts.URL, "", phone("+254 700 000 101"), a).Status,
		otp(t, ts.URL, "", phone("+254 700 000 102"), a).Status,
		otp(t, ts.URL, "", phone("+254 700 000 103"), a).Status,
		otp(t, ts.URL, "", phone("+254 700 000 104"), b).Status,
	}
	if want := []int{202, 202, 429, 202}; !slices.Equal(got, want) {
		t.Errorf("behind a trusted proxy: %v, want %v", got, want)
	}

	cfg, _ = testConfig(t)
	cfg.Limits.PerIP = 2
	direct := start(t, cfg)
	got = []int{
		otp(t, direct.URL, "", phone("+254 700 000 101"), a).Status,
		otp(t, direct.URL, "", phone("+254 700 000 102"), b).Status,
		otp(t, direct.URL, "", phone("+254 700 000 103"), "X-Forwarded-For: 192.0.2.1").Status,
	}
	if want := []int{202, 202, 429}; !slices.Equal(got, want) {
		t.Errorf("without trusted proxies, spoofed X-Forwarded-For: %v, want %v", got, want)
	}
}

func TestMaskPhone(t *testing.T) {
	for in, want := range map[string]string{
		"+254700000012":  "+254*******12",
		"+4915112345678": "+491********78",
		"+12025550100":   "+120******00",
	} {
		if got := maskPhone(in); got != want {
			t.Errorf("maskPhone(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestA429TellsNothingOfAVictimsNumber is issue 14's first finding as it was
// found: a client that has spent its own address budget asks for codes to a
// victim's number, before and after the victim received codes from
// elsewhere, and gets the same answer, naming only otp:ip. No response, not
// even the victim's own, shows the number's budget.
func TestA429TellsNothingOfAVictimsNumber(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, sms *countingSender) {
		cfg.Limits.PerIP = 2
		cfg.TrustedProxies = []string{"127.0.0.1/32"}
		ts := start(t, cfg)
		attacker := "X-Forwarded-For: 203.0.113.66"
		for _, n := range []string{"+254 700 000 101", "+254 700 000 102"} {
			if r := otp(t, ts.URL, "", phone(n), attacker); r.Status != 202 || strings.Contains(r.Header.Get("RateLimit"), rulePhone) || strings.Contains(r.Header.Get("RateLimit-Policy"), rulePhone) {
				t.Fatalf("%d RateLimit %q, Policy %q: want 202 and no %s in either", r.Status, r.Header.Get("RateLimit"), r.Header.Get("RateLimit-Policy"), rulePhone)
			}
		}
		const victim = "+254 700 000 777"
		ask := func() servicetest.Response { return otp(t, ts.URL, "", phone(victim), attacker) }
		before := ask()
		for i := range 3 {
			r := otp(t, ts.URL, "", phone(victim), fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i))
			if r.Status != 202 || strings.Contains(r.Header.Get("RateLimit"), rulePhone) {
				t.Fatalf("the victim's code %d: %d RateLimit %q", i, r.Status, r.Header.Get("RateLimit"))
			}
		}
		after := ask()
		for _, r := range []servicetest.Response{before, after} {
			if r.Status != 429 || !slices.Equal(violated(t, r), []string{ruleIP}) || !strings.HasPrefix(r.Header.Get("RateLimit"), `"otp:ip";r=0;`) || strings.Contains(r.Header.Get("RateLimit"), rulePhone) {
				t.Errorf("the attacker's 429: %d %q %s; want only otp:ip", r.Status, r.Header.Get("RateLimit"), r.Body)
			}
		}
		if got := sms.count(); got != 5 {
			t.Errorf("%d SMS sent, want 5 (2 of the attacker's, 3 of the victim's)", got)
		}
	})
}
