package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

// A shop has at most 4 answers in flight: of 6 at once, the 2 that find
// the slots taken get a 429 naming chat:shop:answers at once, the 4 others
// are answered once their (slow) order lookups return, and the slots come
// back when they have. Another shop is not held up.
func TestAnswersInFlightPerShop(t *testing.T) {
	eachBackend(t, func(t *testing.T, cfg config) {
		cfg.Limits.Answers = defaultConfig().Limits.Answers
		if cfg.Limits.Answers != 4 {
			t.Fatalf("the production limit is %d answers in flight; this test counts 4", cfg.Limits.Answers)
		}
		release := make(chan struct{})
		cfg.Orders = func(ctx context.Context, shop string) (Order, error) {
			if strings.Contains(shop, "busy") {
				select {
				case <-release:
				case <-ctx.Done():
					return Order{}, ctx.Err()
				}
			}
			return fakeOrders(0)(ctx, shop)
		}
		ts := start(t, cfg)
		busy := token(t, "https://busy.myshopify.com")
		responses := make(chan servicetest.Response, 6)
		for range 6 {
			go func() {
				r, _ := servicetest.Post(http.DefaultClient, ts.URL+"/api/chat", busy, question)
				responses <- r
			}()
		}
		for range 2 {
			select {
			case r := <-responses:
				if r.Status != 429 || !slices.Equal(violated(t, r), []string{ruleAnswers}) || r.Header.Get("Retry-After") != "1" {
					t.Fatalf("a fifth answer in flight: %d %v %s, want 429 naming %s with Retry-After 1", r.Status, r.Header, r.Body, ruleAnswers)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no request was refused while 4 answers were in flight")
			}
		}
		if r := chat(t, ts.URL, token(t, "https://calm.myshopify.com"), question); r.Status != 200 {
			t.Errorf("another shop meanwhile: %d", r.Status)
		}
		close(release)
		for range 4 {
			if r := <-responses; r.Status != 200 {
				t.Errorf("a held answer: %d %s", r.Status, r.Body)
			}
		}
		if r := chat(t, ts.URL, busy, question); r.Status != 200 || !strings.Contains(r.Header.Get("RateLimit"), `"chat:shop:answers";r=3`) {
			t.Errorf("after the answers: %d %q, want 200 with 3 slots left after this one", r.Status, r.Header.Get("RateLimit"))
		}
	})
}
