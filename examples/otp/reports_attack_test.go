package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// heldBackend holds its first Decide until release is closed, telling
// entered when it has it.
type heldBackend struct {
	backend.Backend
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (b *heldBackend) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	first := false
	b.once.Do(func() { first = true })
	if first {
		close(b.entered)
		<-b.release
	}
	return b.Backend.Decide(ctx, reqs)
}

// postReport serves one report from address 198.51.100.7 (through the
// trusted loopback proxy) on h.
func postReport(h http.Handler, listing string) *httptest.ResponseRecorder {
	b, _ := json.Marshal(reportBody{Listing: listing, Reason: "scam"})
	req := httptest.NewRequest("POST", "/api/reports", strings.NewReader(string(b)))
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// Two reports decided at once while the review list has room for one:
// the one the list then has no room for is refused with 503, and must
// spend nothing of its reporter's budget (README: "a refused report counts
// for nothing"). Checking for room before the decision and adding after it
// let both be admitted, the second refused with its unit spent.
func TestAReportRefusedForAFullListSpendsNothing_Regression(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	cfg.Limits.ReportsHeld = 1
	ip, err := cfg.ClientIP()
	if err != nil {
		t.Fatal(err)
	}
	noUser := func(*http.Request) (string, error) { return "", ceiling.ErrNoKey }
	hb := &heldBackend{Backend: memory.New(), entered: make(chan struct{}), release: make(chan struct{})}
	rp, err := newReports(cfg, ip, noUser, []ceiling.Option{ceiling.WithBackend(hb)})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.limiter.Close()
	h := rp.file()

	first := make(chan int)
	go func() { first <- postReport(h, "flat-1").Code }()
	<-hb.entered // the first report is being decided
	second := postReport(h, "flat-2").Code
	close(hb.release)
	got := []int{<-first, second}
	if !(got[0] == 202 && got[1] == 503 || got[0] == 503 && got[1] == 202) {
		t.Fatalf("statuses %v, want one 202 and one 503", got)
	}

	// Room again: the address has spent one report (the 202) and this one.
	rp.list.mu.Lock()
	rp.list.max = 10
	rp.list.mu.Unlock()
	w := postReport(h, "flat-3")
	if w.Code != 202 {
		t.Fatalf("status %d, want 202: %s", w.Code, w.Body)
	}
	want := `"report:ip";r=8;t=0`
	if got := w.Header().Get("RateLimit"); got != want {
		t.Errorf("RateLimit %q, want %q: the report refused for a full list spent a unit", got, want)
	}
}

// A reason of maxReason characters is a valid report however it is
// written: in letters beyond ASCII (up to 4 bytes each in UTF-8) or
// escaped by the client's JSON encoder (\u2028, a surrogate pair). The
// body bound must not refuse with 413 what the reason bound admits.
func TestAReasonOfTheMostCharactersIsNotTooLarge_Attack(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg = reportsConfig(cfg)
	ts := start(t, cfg)
	for i, reason := range []string{
		strings.Repeat("é", maxReason),
		strings.Repeat("😀", maxReason),
		`"` + strings.Repeat(`\ud83d\ude00`, maxReason) + `"`, // raw JSON
	} {
		body := `{"listing":"flat-42","reason":` + reason + `}`
		if !strings.HasPrefix(reason, `"`) {
			b, _ := json.Marshal(reportBody{Listing: "flat-42", Reason: reason})
			body = string(b)
		}
		resp, err := http.Post(ts.URL+"/api/reports", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 202 {
			t.Errorf("reason %d (%d bytes of body): status %d, want 202", i, len(body), resp.StatusCode)
		}
	}
}

// The authentication scheme is case-insensitive (RFC 9110 section 11.1):
// "bearer" and "BEARER" carry the admin token as "Bearer" does, and a
// wrong token is still refused whatever the scheme's case.
func TestReviewTakesTheBearerSchemeInAnyCase_Attack(t *testing.T) {
	cfg, _ := testConfig(t)
	ts := start(t, reportsConfig(cfg))
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer " + testAdminToken, 200},
		{"bearer " + testAdminToken, 200},
		{"BEARER " + testAdminToken, 200},
		{"bearer " + testAdminToken + "x", 401},
		{"Basic " + testAdminToken, 401},
		{"Bearer", 401},
	} {
		req, _ := http.NewRequest("GET", ts.URL+"/api/review", nil)
		req.Header.Set("Authorization", tc.auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Authorization %q: status %d, want %d", tc.auth, resp.StatusCode, tc.want)
		}
	}
}
