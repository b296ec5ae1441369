package main

import (
	"encoding/base64"
	"fmt"
	"github.com/ceiling-go/ceiling/internal/citest"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// hugeToken is a well-formed HS256 token of about 900 KB whose signature
// does not verify: parsed, its payload (a long JSON array) costs
// milliseconds of base64 and JSON work per request before the signature
// check fails (issue 12.9 measured ~16 ms).
func hugeToken() string {
	b64 := base64.RawURLEncoding
	payload := `{"dest":"https://flood.myshopify.com","sub":"flood","exp":9999999999,"pad":[` + strings.Repeat("0,", 337_000) + `0]}`
	return b64.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		b64.EncodeToString([]byte(payload)) + "." + b64.EncodeToString(make([]byte, 32))
}

// Local overload is not a backend failure (issue 12.9), as the issue
// measured it on the real binary: for 5 s, 100 clients (100 addresses
// behind the trusted proxy) post ~900 KB bearer tokens that do not verify,
// while a shop that has spent its minute keeps asking, on a healthy Redis
// with the production timeout (100ms) and breaker. The huge tokens are
// refused unread, so the flood costs no JWT parsing: each gets a 401 (or
// a 429 once its address is spent), or a 503 when this process was too
// busy to decide it, or its timeout was not confirmed as Redis's by a
// probe (shed, counted), never a fail-mode admission; the spent shop gets
// no answer but its 429; and the breaker never moves: /healthz, polled
// throughout, stays 200, no "backend degraded" line is logged and
// /metrics counts no transition. Before, the same flood opened the breaker twice and the shop
// got 17 answers (the limiter failed open).
//
// The size cap only makes the flood cheaper (TestOversizedTokenRefusedUnread
// pins it): with it removed this test still passes, held by the Redis
// store's patience with a starved process and by the limiter's probe that
// confirms a timeout before the breaker opens.
func TestHugeTokenFloodOpensNoBreakerAndAdmitsNoSpentShop(t *testing.T) {
	citest.Only(t)
	srv := redistest.Server(t)
	p := servicetest.Start(t, chatBinary.Path(t), []string{
		"REDIS_URL=redis://" + srv.Addr + "/0", "CHAT_JWT_SECRET=" + testSecret, "TRUSTED_PROXIES=127.0.0.0/8",
	})
	const (
		clients = 100
		flood   = 5 * time.Second
	)
	// Generous: only a hang may fail a request; the load is the point.
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: clients + 2, MaxConnsPerHost: clients + 2},
		Timeout:   30 * time.Second,
	}
	defer client.CloseIdleConnections()
	shop := token(t, "https://spent.myshopify.com")
	shopAddr := "X-Forwarded-For: 203.0.113.1"
	perMinute := int(defaultConfig().Limits.PerMinute)
	for i := range perMinute {
		if r, err := servicetest.Post(client, p.URL+"/api/chat", shop, question, shopAddr); err != nil || r.Status != 200 {
			t.Fatalf("spending the shop's minute, request %d: %d %v", i+1, r.Status, err)
		}
	}

	auth := "Bearer " + hugeToken() // one string for every request
	deadline := time.Now().Add(flood)
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		floodStatus        = map[int]int{}
		floodErrs          []error
		floodTook          []time.Duration
		shopStatus         = map[int]int{}
		shopBad            []string
		healthPolls        atomic.Int64
		healthBad          []string
		floodSent, shopReq atomic.Int64
	)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				req, err := http.NewRequest(http.MethodPost, p.URL+"/api/chat", strings.NewReader(question))
				if err != nil {
					panic(err)
				}
				req.Header["Authorization"] = []string{auth}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
				floodSent.Add(1)
				start := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					floodErrs = append(floodErrs, err)
				} else {
					floodStatus[resp.StatusCode]++
				}
				floodTook = append(floodTook, took)
				mu.Unlock()
			}
		}()
	}
	wg.Add(2)
	go func() { // the spent shop, one request after another
		defer wg.Done()
		for time.Now().Before(deadline) {
			r, err := servicetest.Post(client, p.URL+"/api/chat", shop, question, shopAddr)
			shopReq.Add(1)
			mu.Lock()
			shopStatus[r.Status]++
			if err != nil || r.Status != 429 || !strings.Contains(r.Body, ruleMinute) {
				shopBad = append(shopBad, fmt.Sprintf("%d %v %.200s", r.Status, err, r.Body))
			}
			mu.Unlock()
		}
	}()
	go func() { // the breaker, as a readiness probe sees it
		defer wg.Done()
		for time.Now().Before(deadline) {
			r, err := servicetest.Get(client, p.Admin+"/healthz")
			healthPolls.Add(1)
			if err != nil || r.Status != 200 {
				mu.Lock()
				healthBad = append(healthBad, fmt.Sprintf("%s: %d %v %.200s", time.Now().Format("15:04:05.000"), r.Status, err, r.Body))
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()

	m, err := servicetest.Get(client, p.Admin+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(floodTook)
	t.Logf("flood: %d requests from %d clients in %v, statuses %v, %d transport errors, took median %v, slowest %v; spent shop: %d requests, statuses %v; /healthz: %d polls, %d not 200",
		floodSent.Load(), clients, flood, floodStatus, len(floodErrs), floodTook[len(floodTook)/2].Round(time.Millisecond), floodTook[len(floodTook)-1].Round(time.Millisecond),
		shopReq.Load(), shopStatus, healthPolls.Load(), len(healthBad))
	var nonzero []string
	for _, line := range regexp.MustCompile(`(?m)^ceiling_rate_limiting_(degraded|fail_mode_admissions_total|backend_errors_total)\b.*$`).FindAllString(m.Body, -1) {
		if !strings.HasSuffix(line, " 0") {
			nonzero = append(nonzero, line)
		}
	}
	t.Logf("service metrics not 0: %v", nonzero)
	if len(floodErrs) > 0 {
		// Not a failure: on an overloaded machine the server may give up
		// reading a 900 KB header (ReadHeaderTimeout) and close the
		// connection; that is no answer from the limiter.
		t.Logf("%d flood requests got no answer, e.g. %v", len(floodErrs), floodErrs[0])
	}

	if len(shopBad) > 0 {
		t.Errorf("the spent shop got %d answers other than a 429 naming %s during the flood (a 200 is the limiter failing open), e.g. %v", len(shopBad), ruleMinute, shopBad[:min(3, len(shopBad))])
	}
	if shopReq.Load() == 0 {
		t.Error("the spent shop sent no request during the flood")
	}
	// A request this process was too busy to decide, or whose timeout no
	// probe confirmed as Redis's, is shed: a 503 that /healthz counts
	// ("shed"), never a fail-mode admission.
	hz, err := servicetest.Get(client, p.Admin+"/healthz")
	if err != nil {
		t.Fatal(err)
	}
	shed := 0
	if m := regexp.MustCompile(`"shed":(\d+)`).FindStringSubmatch(hz.Body); m != nil {
		shed, _ = strconv.Atoi(m[1])
	}
	for status, n := range floodStatus {
		if status != 401 && status != 429 && !(status == 503 && n <= shed) {
			t.Errorf("%d flood requests got %d, want 401 (an invalid token), 429 once an address is spent, or 503 when shed (%d shed)", n, status, shed)
		}
	}
	for _, line := range nonzero {
		if strings.HasPrefix(line, "ceiling_rate_limiting_fail_mode_admissions_total") {
			t.Errorf("a rule was admitted by its fail mode on a healthy Redis: %s", line)
		}
	}
	if floodStatus[401] == 0 {
		t.Errorf("no flood request got a 401: %v", floodStatus)
	}
	if len(healthBad) > 0 || healthPolls.Load() == 0 {
		t.Errorf("/healthz left 200 during the flood %d times of %d polls, e.g. %v", len(healthBad), healthPolls.Load(), healthBad[:min(3, len(healthBad))])
	}
	if n := strings.Count(p.Log(), "backend degraded"); n > 0 {
		t.Errorf("the service logged %d breaker transitions to degraded on a healthy Redis", n)
	}
	if !slices.Contains(strings.Split(m.Body, "\n"), "ceiling_rate_limiting_degraded_transitions_total 0") {
		t.Errorf("/metrics does not say 0 breaker transitions: %s", regexp.MustCompile(`(?m)^ceiling_rate_limiting_degraded.*$`).FindAllString(m.Body, -1))
	}
	if t.Failed() {
		t.Logf("service log:\n%s", p.Log())
	}
	p.Stop(t)
}
