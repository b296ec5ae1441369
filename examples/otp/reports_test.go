package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/golang-jwt/jwt/v5"
)

// testAdminToken is the tests' OTP_ADMIN_TOKEN.
const testAdminToken = "review-token-0123456789abcdef0123"

// report files a dispute report of listing from the address in xff (a
// trusted proxy's X-Forwarded-For), signed in with tok when it is set.
func report(t *testing.T, url, tok, xff, listing, reason string) servicetest.Response {
	t.Helper()
	b, _ := json.Marshal(reportBody{Listing: listing, Reason: reason})
	resp, err := servicetest.Post(http.DefaultClient, url+"/api/reports", tok, string(b), "X-Forwarded-For: "+xff)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// review reads GET /api/review with the bearer token tok (none when empty).
func review(t *testing.T, url, tok string) (int, []flaggedListing) {
	t.Helper()
	req, err := http.NewRequest("GET", url+"/api/review", nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	var out struct{ Review []flaggedListing }
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /api/review: %s: %v", body, err)
	}
	return resp.StatusCode, out.Review
}

// reportsConfig is testConfig behind a trusted proxy (each test reporter
// has an address of its own), with the admin token set.
func reportsConfig(cfg config) config {
	cfg.TrustedProxies = []string{"127.0.0.1/32"}
	cfg.AdminToken = testAdminToken
	return cfg
}

// Many people reporting one listing put it on the review list, and every
// report stays on it: none is refused for the listing's sake, none is
// dropped, and no answer tells a reporter whether the listing is on review.
func TestReportsPutAListingOnReviewAndDropNone(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, _ *countingSender) {
		ts := start(t, reportsConfig(cfg))
		var answers []string
		for i := range 6 {
			r := report(t, ts.URL, "", fmt.Sprintf("198.51.100.%d", i), "flat-42", "not the flat in the photos "+strconv.Itoa(i))
			if r.Status != http.StatusAccepted {
				t.Fatalf("report %d: %d %s, want 202", i, r.Status, r.Body)
			}
			if strings.Contains(r.Header.Get("RateLimit")+r.Header.Get("RateLimit-Policy"), ruleReportListing) {
				t.Errorf("report %d: RateLimit %q, Policy %q name the listing's rule", i, r.Header.Get("RateLimit"), r.Header.Get("RateLimit-Policy"))
			}
			answers = append(answers, r.Body+" "+r.Header.Get("RateLimit"))
			if i == 2 {
				if status, got := review(t, ts.URL, testAdminToken); status != 200 || len(got) != 0 {
					t.Errorf("after 3 reports (the threshold): %d %v, want 200 and an empty review list", status, got)
				}
			}
		}
		for i, a := range answers {
			if a != answers[0] {
				t.Errorf("report %d's answer %q differs from the first's %q: it tells whether the listing is on review", i, a, answers[0])
			}
		}
		for i := range 3 {
			report(t, ts.URL, "", fmt.Sprintf("198.51.100.%d", i), "flat-7", "a fake")
		}
		status, got := review(t, ts.URL, testAdminToken)
		if status != 200 || len(got) != 1 || got[0].Listing != "flat-42" || got[0].Reports != 6 || len(got[0].Reasons) != 6 {
			t.Fatalf("review list %d %+v, want flat-42 alone with its 6 reports (flat-7 has 3, the threshold)", status, got)
		}
		if got[0].Reasons[0] != "not the flat in the photos 0" || got[0].Reasons[5] != "not the flat in the photos 5" {
			t.Errorf("reasons %q, want every report's, in order", got[0].Reasons)
		}
	})
}

// The reporter's rules reject: 10 reports an hour per address, 5 per
// signed-in user whatever the address. A refused report is told so (429)
// and counts for nothing, the listing's rule included.
func TestReporterRulesRejectAndRefusedReportsCountForNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config, _ *countingSender) {
		ts := start(t, reportsConfig(cfg))
		var got []int
		for i := range 11 {
			got = append(got, report(t, ts.URL, "", "203.0.113.5", fmt.Sprintf("listing-%d", i), "spam").Status)
		}
		if want := append(slices.Repeat([]int{202}, 10), 429); !slices.Equal(got, want) {
			t.Errorf("one address: %v, want %v", got, want)
		}
		last := report(t, ts.URL, "", "203.0.113.5", "listing-9", "spam")
		if last.Status != 429 || !slices.Equal(violated(t, last), []string{ruleReportIP}) || last.Header.Get("Retry-After") == "" {
			t.Errorf("the address's refusal: %d %s, want 429 naming %s with Retry-After", last.Status, last.Body, ruleReportIP)
		}

		alice := servicetest.Token(t, testSecret, jwt.MapClaims{"sub": "alice"})
		got = nil
		for i := range 6 {
			got = append(got, report(t, ts.URL, alice, fmt.Sprintf("192.0.2.%d", i), "shop-1", "alice again").Status)
		}
		if want := []int{202, 202, 202, 202, 202, 429}; !slices.Equal(got, want) {
			t.Errorf("alice from six addresses: %v, want %v", got, want)
		}
		if r := report(t, ts.URL, alice, "192.0.2.99", "shop-1", "alice again"); !slices.Equal(violated(t, r), []string{ruleReportUser}) {
			t.Errorf("alice's refusal names %v, want %s", violated(t, r), ruleReportUser)
		}
		forged := servicetest.Token(t, "not-the-secret", jwt.MapClaims{"sub": "bob"})
		if r := report(t, ts.URL, forged, "192.0.2.100", "shop-2", "forged"); r.Status != 202 {
			t.Errorf("a forged token: %d, want 202 (an anonymous reporter)", r.Status)
		}
		// shop-1 has 5 reports counted: past its threshold of 3, on review.
		// The two refused ones, had they counted, would show as 7.
		if _, list := review(t, ts.URL, testAdminToken); len(list) != 1 || list[0].Listing != "shop-1" || list[0].Reports != 5 {
			t.Errorf("review list %+v, want shop-1 with its 5 accepted reports", list)
		}
	})
}

// A refused report spends nothing of the listing's rule: after the
// reporter's refusal, the listing goes on review at its threshold exactly,
// not earlier.
func TestARefusedReportDoesNotMoveTheListingTowardsReview(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	cfg.Limits.ReportsPerIP = 2
	ts := start(t, cfg)
	got := []int{
		report(t, ts.URL, "", "198.51.100.1", "flat-1", "a").Status,
		report(t, ts.URL, "", "198.51.100.1", "flat-1", "b").Status,
		report(t, ts.URL, "", "198.51.100.1", "flat-1", "refused").Status,
		report(t, ts.URL, "", "198.51.100.2", "flat-1", "c").Status,
	}
	if want := []int{202, 202, 429, 202}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if _, list := review(t, ts.URL, testAdminToken); len(list) != 0 {
		t.Fatalf("after 3 accepted reports: review list %+v, want none (the refused one counted)", list)
	}
	report(t, ts.URL, "", "198.51.100.3", "flat-1", "d")
	if _, list := review(t, ts.URL, testAdminToken); len(list) != 1 || !slices.Equal(list[0].Reasons, []string{"a", "b", "c", "d"}) {
		t.Errorf("after the 4th accepted report: %+v, want flat-1 with a, b, c, d", list)
	}
}

// GET /api/review answers only the bearer of the admin token; without
// one configured it answers nobody; a short token stops the start.
func TestReviewNeedsTheAdminToken(t *testing.T) {
	cfg, _ := testConfig(t)
	ts := start(t, reportsConfig(cfg))
	for _, tc := range []struct {
		name, tok string
		status    int
	}{
		{"no token", "", 401},
		{"a wrong token", "review-token-0123456789abcdef0124", 401},
		{"a prefix of the token", testAdminToken[:20], 401},
		{"a user's token", servicetest.Token(t, testSecret, jwt.MapClaims{"sub": "admin"}), 401},
		{"the admin token", testAdminToken, 200},
	} {
		if status, _ := review(t, ts.URL, tc.tok); status != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, status, tc.status)
		}
	}

	cfg.AdminToken = ""
	off := start(t, cfg)
	for _, tok := range []string{"", testAdminToken} {
		if status, _ := review(t, off.URL, tok); status != 403 {
			t.Errorf("no OTP_ADMIN_TOKEN, token %q: %d, want 403", tok, status)
		}
	}
	cfg.AdminToken = "short"
	if _, _, err := newServer(cfg); err == nil || !strings.Contains(err.Error(), "OTP_ADMIN_TOKEN") {
		t.Errorf("a 5-byte token: err %v, want one naming OTP_ADMIN_TOKEN", err)
	}
}

// Bad reports are refused before the limiter is asked, and spend nothing.
func TestBadReportsAreRefusedAndCountForNothing(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	cfg.Limits.ReportsPerIP = 1
	ts := start(t, cfg)
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"malformed JSON", `{"listing": `, 400},
		{"empty body", ``, 400},
		{"no listing", `{"reason": "scam"}`, 400},
		{"no reason", `{"listing": "flat-1"}`, 400},
		{"a blank reason", `{"listing": "flat-1", "reason": "   "}`, 400},
		{"a listing with spaces", `{"listing": "flat 1", "reason": "scam"}`, 400},
		{"a listing of 65 characters", `{"listing": "` + strings.Repeat("a", 65) + `", "reason": "scam"}`, 400},
		{"a reason of 281 characters", `{"listing": "flat-1", "reason": "` + strings.Repeat("é", 281) + `"}`, 400},
		{"two JSON values", `{"listing": "flat-1", "reason": "scam"} {"listing": "flat-2", "reason": "scam"}`, 400},
		{"an unknown field", `{"listing": "flat-1", "reason": "scam", "phone": "+254700000000"}`, 400},
		{"over 4 KiB", `{"listing": "flat-1", "reason": "` + strings.Repeat("x", 4096) + `"}`, 413},
	} {
		resp, err := servicetest.Post(http.DefaultClient, ts.URL+"/api/reports", "", tc.body, "X-Forwarded-For: 198.51.100.1")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s %s, want %d problem+json", tc.name, resp.Status, resp.Header.Get("Content-Type"), resp.Body, tc.status)
		}
	}
	if r := report(t, ts.URL, "", "198.51.100.1", "flat-1", "the one that counts"); r.Status != 202 {
		t.Errorf("a valid report after the bad ones: %d %s, want 202", r.Status, r.Body)
	}
}

// The review list holds a bounded number of reports; past it a report is
// refused with 503 and Retry-After, and logged, never dropped.
func TestAFullReviewListRefusesReportsLoudly(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	logs := &servicetest.LogBuffer{}
	cfg.Logger = logFor(logs)
	cfg.Limits.ReportsHeld = 2
	ts := start(t, cfg)
	var got []int
	for i := range 3 {
		got = append(got, report(t, ts.URL, "", "198.51.100.1", "flat-"+strconv.Itoa(i), "scam").Status)
	}
	if want := []int{202, 202, 503}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	r := report(t, ts.URL, "", "198.51.100.2", "flat-9", "scam")
	var p struct {
		Status     int
		RetryAfter int64 `json:"retry-after"`
	}
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil || p.Status != 503 || r.Header.Get("Retry-After") != strconv.FormatInt(p.RetryAfter, 10) || p.RetryAfter < 1 {
		t.Errorf("the 503: Retry-After %q, body %s; want whole seconds in both", r.Header.Get("Retry-After"), r.Body)
	}
	if !strings.Contains(logs.String(), "the review list is full") || !strings.Contains(logs.String(), "listing=flat-2") {
		t.Errorf("the refusal is not logged:\n%s", logs.String())
	}
}

// The listing that goes on review is logged once, with its reports.
func TestAListingOnReviewIsLoggedOnce(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	logs := &servicetest.LogBuffer{}
	cfg.Logger = logFor(logs)
	ts := start(t, cfg)
	for i := range 6 {
		report(t, ts.URL, "", fmt.Sprintf("198.51.100.%d", i), "flat-42", "scam")
	}
	if n := strings.Count(logs.String(), `msg="listing flagged for review" listing=flat-42 reports=4`); n != 1 {
		t.Errorf("%d log lines flag flat-42 with 4 reports, want 1:\n%s", n, logs.String())
	}
}

func logFor(b *servicetest.LogBuffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
