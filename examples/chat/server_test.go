package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/golang-jwt/jwt/v5"
)

func TestReplyCarriesTheOrder(t *testing.T) {
	cfg, _ := testConfig(t)
	ts := start(t, cfg)
	shop := "https://shop-1.myshopify.com"
	resp := chat(t, ts.URL, token(t, shop), question)
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", resp.Status, resp.Body)
	}
	var got chatReply
	if err := json.Unmarshal([]byte(resp.Body), &got); err != nil {
		t.Fatal(err)
	}
	wantReply, wantTokens := fakeModel("where is my order?", orderOf(shop), cfg.MaxOutputTokens)
	if got.Order != orderOf(shop) || got.Reply != wantReply || got.Tokens != wantTokens {
		t.Errorf("reply %+v, want order %+v, reply %q, %d tokens", got, orderOf(shop), wantReply, wantTokens)
	}
	if !strings.Contains(resp.Header.Get("RateLimit"), `"chat:shop:minute";r=29`) {
		t.Errorf("RateLimit %q does not count the request against the shop's minute", resp.Header.Get("RateLimit"))
	}
}

// The limiter counts a request before the handler looks at its body, so a
// client cannot send malformed requests for free.
func TestMalformedBodiesCountThen429(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		ts := start(t, cfg)
		tok := token(t, "https://shop-1.myshopify.com")
		var last servicetest.Response
		got := statuses(t, 35, func() servicetest.Response {
			last = chat(t, ts.URL, tok, `{"message": `)
			return last
		})
		if want := append(repeat(30, 400), repeat(5, 429)...); !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if got, want := violated(t, last), []string{ruleMinute}; !slices.Equal(got, want) {
			t.Errorf("violated policies %v, want %v", got, want)
		}
		if last.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	})
}

func TestConcurrentRequestsAdmitExactlyTheLimit(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		cfg.Limits.PerMinute = 5
		ts := start(t, cfg)
		tok := token(t, "https://shop-1.myshopify.com")
		got, err := servicetest.Parallel(10, 10, func(int) (int, error) {
			r, err := servicetest.Post(http.DefaultClient, ts.URL+"/api/chat", tok, question)
			return r.Status, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got[200] != 5 || got[429] != 5 {
			t.Errorf("statuses %v, want 5 × 200 and 5 × 429", got)
		}
	})
}

func TestWindowReopensAfterItPasses(t *testing.T) {
	// Long enough that three requests surely fit in it on a loaded machine.
	const window = time.Second
	eachBackend(t, func(t *testing.T, cfg config) {
		cfg.Limits.PerMinute, cfg.Limits.Minute = 2, window
		ts := start(t, cfg)
		tok := token(t, "https://shop-1.myshopify.com")
		begin := time.Now()
		if got, want := statuses(t, 3, func() servicetest.Response { return chat(t, ts.URL, tok, question) }), []int{200, 200, 429}; !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if !servicetest.Eventually(5*time.Second, func() bool { return chat(t, ts.URL, tok, question).Status == 200 }) {
			t.Fatal("the window did not reopen within 5s")
		}
		// A lower bound only: the window cannot reopen before it has passed
		// since the first admission, which came after begin. (Redis's clock
		// and ours are the same host clock; 5ms absorbs rounding.)
		if elapsed := time.Since(begin); elapsed < window-5*time.Millisecond {
			t.Errorf("reopened after %v, before the %v window passed", elapsed, window)
		}
	})
}

// All or nothing: requests the minute rule refuses spend nothing of the
// day's budget, so after the minute passes the day still has room.
func TestMinuteRejectionsSpendNoDayBudget(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		cfg.Limits.PerMinute, cfg.Limits.Minute = 2, time.Second
		cfg.Limits.PerDay = 3
		ts := start(t, cfg)
		tok := token(t, "https://shop-1.myshopify.com")
		send := func() servicetest.Response { return chat(t, ts.URL, tok, question) }
		if got, want := statuses(t, 6, send), []int{200, 200, 429, 429, 429, 429}; !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if !servicetest.Eventually(5*time.Second, func() bool { return send().Status == 200 }) {
			t.Fatal("the third request of the day was never admitted: the minute's rejections spent the day's budget")
		}
		// The minute rule may refuse it too, depending on whether the
		// second admission has left the window yet; the day rule must.
		last := send()
		if got := violated(t, last); last.Status != 429 || !slices.Contains(got, ruleDay) {
			t.Errorf("fourth admission attempt: status %d, violated %v; want 429 by %s", last.Status, got, ruleDay)
		}
	})
}

// Each reply is charged with the tokens the model reports: the budget runs
// out after as many replies as it pays for, each admitted only while the
// most it can cost still fits, and a 400 costs no tokens.
func TestTokenBudgetChargedAfterEachReply(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		shop := "https://shop-1.myshopify.com"
		_, perReply := fakeModel("where is my order?", orderOf(shop), cfg.MaxOutputTokens)
		reserve := promptTokens("where is my order?") + cfg.MaxOutputTokens
		// Room for two replies and one reservation: the third reply fits
		// its reservation, and after it the rest is less than one.
		cfg.Limits.Tokens = 2*perReply + reserve
		ts := start(t, cfg)
		tok := token(t, shop)
		var last servicetest.Response
		got := []int{}
		for _, body := range []string{"{", "{", "{", question, question, question, question} {
			last = chat(t, ts.URL, tok, body)
			got = append(got, last.Status)
		}
		if want := []int{400, 400, 400, 200, 200, 200, 429}; !slices.Equal(got, want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		if got, want := violated(t, last), []string{ruleTokens}; !slices.Equal(got, want) {
			t.Errorf("violated policies %v, want %v", got, want)
		}
	})
}

// TestConcurrentLongPromptsNeverOverdrawTheBudget pins issue 14's seventh
// finding: near the end of a shop's day, 30 long prompts at once. Each
// reserves its prompt and the model's longest answer when it is decided,
// so those that fit are answered and the rest refused: the tokens the
// day's replies report never add up to more than its budget. (With a
// reservation of one token all 30 were admitted and charged afterwards:
// 4,200 tokens each against what was left.)
func TestConcurrentLongPromptsNeverOverdrawTheBudget(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		const budget = 20_000
		cfg.Limits.Tokens, cfg.Limits.PerMinute = budget, 100
		ts := start(t, cfg)
		tok := token(t, "https://shop-1.myshopify.com")
		long, _ := json.Marshal(chatRequest{Message: strings.Repeat("where is my order? ", 800)}) // ~3,800 tokens
		var mu sync.Mutex
		var spent int64
		send := func(int) (int, error) {
			r, err := servicetest.Post(http.DefaultClient, ts.URL+"/api/chat", tok, string(long))
			if err == nil && r.Status == http.StatusOK {
				var reply chatReply
				if err := json.Unmarshal([]byte(r.Body), &reply); err != nil {
					return 0, err
				}
				mu.Lock()
				spent += reply.Tokens
				mu.Unlock()
			}
			return r.Status, err
		}
		// Most of the day goes first, one request at a time.
		for i := range 3 {
			if status, err := send(i); err != nil || status != 200 {
				t.Fatalf("request %d of the morning: %d %v", i, status, err)
			}
		}
		got, err := servicetest.Parallel(30, 30, send)
		if err != nil {
			t.Fatal(err)
		}
		if spent > budget {
			t.Errorf("replies charged %d tokens in all, over the %d budget (statuses %v)", spent, budget, got)
		}
		if got[200] < 1 || got[200]+got[429] != 30 {
			t.Errorf("statuses %v, want the requests that fit answered (at least one) and the rest refused", got)
		}
	})
}

// The order lookup runs while the limiter decides; a rejected request
// cancels it and its 429 carries nothing of it.
func TestRejectedRequestCarriesNoOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		// The first lookup (the admitted request's) answers at once; the
		// others wait for their context, as a slow order API would, so
		// that only the rejection can end them.
		var started, cancelled atomic.Int32
		cfg.Orders = func(ctx context.Context, shop string) (Order, error) {
			if started.Add(1) == 1 {
				return orderOf(shop), nil
			}
			select {
			case <-ctx.Done():
				cancelled.Add(1)
				return Order{}, ctx.Err()
			case <-time.After(10 * time.Second):
				return orderOf(shop), nil
			}
		}
		cfg.Limits.PerMinute = 1
		ts := start(t, cfg)
		shop := "https://shop-1.myshopify.com"
		tok := token(t, shop)
		ok, refused := chat(t, ts.URL, tok, question), chat(t, ts.URL, tok, question)
		if ok.Status != 200 || !strings.Contains(ok.Body, orderOf(shop).ID) {
			t.Errorf("first: %d %s, want 200 with order %s", ok.Status, ok.Body, orderOf(shop).ID)
		}
		if refused.Status != 429 || strings.Contains(refused.Body, orderOf(shop).ID) || strings.Contains(refused.Body, `"order"`) {
			t.Errorf("second: %d %s, want a 429 without the order", refused.Status, refused.Body)
		}
		if got, want := started.Load(), int32(2); got != want {
			t.Errorf("%d lookups started, want %d (one per request, speculatively)", got, want)
		}
		if got, want := cancelled.Load(), int32(1); got != want {
			t.Errorf("%d lookups cancelled, want %d (the rejected request's)", got, want)
		}
	})
}

// Only a verified token names a shop: requests without one get 401 from the
// handler and spend none of any shop's budget, whatever shop they claim.
func TestUnauthenticatedRequestsSpendNoShopBudget(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Limits.PerMinute = 3
	ts := start(t, cfg)
	shop := "https://shop-1.myshopify.com"
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"dest": shop, "sub": "x", "exp": time.Now().Add(time.Hour).Unix()}).
		SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"no token":     "",
		"garbage":      "not-a-jwt",
		"wrong secret": servicetest.Token(t, "another-secret", jwt.MapClaims{"dest": shop, "sub": "x"}),
		"alg none":     none,
		"expired":      servicetest.Token(t, testSecret, jwt.MapClaims{"dest": shop, "sub": "x", "exp": time.Now().Add(-time.Minute).Unix()}),
		"no expiry":    servicetest.Token(t, testSecret, jwt.MapClaims{"dest": shop, "sub": "x", "exp": nil}),
		"no shop":      servicetest.Token(t, testSecret, jwt.MapClaims{"sub": "x"}),
		"no user":      servicetest.Token(t, testSecret, jwt.MapClaims{"dest": shop}),
	} {
		for range 2 {
			resp := chat(t, ts.URL, tok, question)
			if resp.Status != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: status %d (WWW-Authenticate %q), want 401 with a challenge", name, resp.Status, resp.Header.Get("WWW-Authenticate"))
			}
		}
	}
	tok := token(t, shop)
	if got, want := statuses(t, 4, func() servicetest.Response { return chat(t, ts.URL, tok, question) }), []int{200, 200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("the shop's own requests after 16 unauthenticated ones: %v, want %v", got, want)
	}
}

// A bearer token over maxToken bytes is refused unread, even when it is
// validly signed: a 401, and none of its shop's budget spent; one at the
// cap is verified and answered.
func TestOversizedTokenRefusedUnread(t *testing.T) {
	cfg, _ := testConfig(t)
	ts := start(t, cfg)
	shop := "https://padded.myshopify.com"
	// The longest signed token within the cap, and the shortest over it:
	// base64 makes 3 bytes of padding 4 of token.
	padded := func(n int) string {
		return servicetest.Token(t, testSecret, jwt.MapClaims{"dest": shop, "sub": "x", "pad": strings.Repeat("x", n)})
	}
	var atCap, overCap string
	for n, tries := max((maxToken-len(padded(0)))*3/4-8, 0), 0; overCap == "" && tries < 32; n, tries = n+1, tries+1 {
		if tok := padded(n); len(tok) <= maxToken {
			atCap = tok
		} else {
			overCap = tok
		}
	}
	if atCap == "" || overCap == "" {
		t.Fatalf("no padded token brackets the cap of %d bytes", maxToken)
	}
	if r := chat(t, ts.URL, overCap, question); r.Status != http.StatusUnauthorized {
		t.Errorf("a signed token of %d bytes (cap %d): %d, want 401", len(overCap), maxToken, r.Status)
	}
	if r := chat(t, ts.URL, atCap, question); r.Status != 200 || !strings.Contains(r.Header.Get("RateLimit"), `"chat:shop:minute";r=29`) {
		t.Errorf("a signed token of %d bytes (cap %d): %d %q, want 200, the shop's first request", len(atCap), maxToken, r.Status, r.Header.Get("RateLimit"))
	}
}

// The per-address rule counts every request, authenticated or not, and
// with trusted proxies keys by the client their X-Forwarded-For names.
func TestClientAddressRuleBehindTrustedProxies(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Limits.PerIP = 2
	cfg.TrustedProxies = []string{"127.0.0.0/8"}
	ts := start(t, cfg)
	tok := token(t, "https://shop-1.myshopify.com")
	a, b := "X-Forwarded-For: 198.51.100.7", "X-Forwarded-For: 203.0.113.9, 198.51.100.8"
	got := []int{
		chat(t, ts.URL, "", question, a).Status,
		chat(t, ts.URL, tok, question, a).Status,
		chat(t, ts.URL, tok, question, a).Status,
		chat(t, ts.URL, tok, question, b).Status,
	}
	if want := []int{401, 200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// Three instances without a shared backend each enforce their own limit:
// the check that a per-instance limiter fails, shown on the memory backend.
// TestThreeInstancesShareOneRedis is the same check passing.
func TestThreeInstancesOnMemoryAdmitThreeTimesTheLimit(t *testing.T) {
	var urls []string
	for range 3 {
		cfg, _ := testConfig(t)
		urls = append(urls, start(t, cfg).URL)
	}
	tok := token(t, "https://shop-1.myshopify.com")
	got, err := servicetest.Parallel(120, 12, func(i int) (int, error) {
		r, err := servicetest.Post(http.DefaultClient, urls[i%3]+"/api/chat", tok, question)
		return r.Status, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[200] != 90 || got[429] != 30 {
		t.Errorf("statuses %v, want 90 × 200 (30 per instance) and 30 × 429", got)
	}
}

// Instances declared on the memory backend: /healthz says the limits are
// per instance (still 200: a warning, not a degradation).
func TestHealthWarnsOfPerInstanceLimits(t *testing.T) {
	cfg, _ := testConfig(t)
	cfg.Instances = 3
	ts := start(t, cfg)
	status, h := health(t, ts.Admin)
	if status != http.StatusOK || len(h.Warnings) != 1 || !strings.Contains(h.Warnings[0], "every instance enforces the full limit") {
		t.Errorf("/healthz: %d %+v, want 200 with the per-instance warning", status, h)
	}
}
