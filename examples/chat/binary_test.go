package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// GET /healthz and GET /metrics are served on the admin listener, and
// the public one answers them 404 (issue 23.13).
func TestAdminEndpointsStayOffThePublicListener(t *testing.T) {
	p := servicetest.Start(t, chatBinary.Path(t), nil)
	servicetest.AdminOnly(t, p)
	p.Stop(t)
}

// The admin listener stays the operator's: an empty -admin is refused at
// start, one that binds every interface (-admin :0, 0.0.0.0, [::] or
// ADMIN_ADDR=:0) is logged as a warning, and on loopback it answers only
// requests addressed to a loopback name, not a rebound DNS name.
func TestAdminAddressIsLoopbackOrWarned(t *testing.T) {
	servicetest.AdminAddresses(t, chatBinary.Path(t), nil)
}

// The real binary as `go run ./examples/chat` starts it on a fresh machine:
// no Redis, no secret. It warns loudly about both, answers a token it
// minted itself, and shuts down cleanly on SIGTERM.
func TestBinaryStartsAnswersAndStops(t *testing.T) {
	bin := chatBinary.Path(t)
	p := servicetest.Start(t, bin, nil)
	for _, warning := range []string{"EVERY INSTANCE ENFORCES ITS OWN LIMITS", "CHAT_JWT_SECRET is not set"} {
		if !strings.Contains(p.Log(), warning) {
			t.Errorf("start-up log lacks %q:\n%s", warning, p.Log())
		}
	}
	out, err := exec.Command(bin, "-mint-token", "https://shop-1.myshopify.com").Output()
	if err != nil {
		t.Fatalf("-mint-token: %v", err)
	}
	resp, err := servicetest.Post(http.DefaultClient, p.URL+"/api/chat", strings.TrimSpace(string(out)), question)
	if err != nil {
		t.Fatal(err)
	}
	var reply chatReply
	if resp.Status != 200 || json.Unmarshal([]byte(resp.Body), &reply) != nil || reply.Reply == "" || reply.Order.ID == "" {
		t.Errorf("chat: %d %s, want 200 with a reply and an order", resp.Status, resp.Body)
	}
	if resp, err := servicetest.Get(http.DefaultClient, p.Admin+"/healthz"); err != nil || resp.Status != 200 {
		t.Errorf("/healthz: %d %v, want 200", resp.Status, err)
	}
	p.Stop(t)
}

// Three processes on three ports sharing one Redis, requests spread over
// them: exactly the limit is admitted per shop, in total. (On the memory
// backend the same check admits three times the limit:
// TestThreeInstancesOnMemoryAdmitThreeTimesTheLimit.)
func TestThreeInstancesShareOneRedis(t *testing.T) {
	srv := redistest.Shared(t)
	bin := chatBinary.Path(t)
	// A generous LIMITER_TIMEOUT: a decision that failed open on a loaded
	// machine would be admitted uncounted, which is not what this counts.
	env := []string{"REDIS_URL=redis://" + srv.Addr + "/0", "CHAT_JWT_SECRET=" + testSecret,
		"KEY_SECRET=" + strings.Repeat("k", 32), "LIMITER_TIMEOUT=2s"}
	var procs []*servicetest.Process
	var urls []string
	for range 3 {
		p := servicetest.Start(t, bin, env)
		procs = append(procs, p)
		urls = append(urls, p.URL)
	}
	// Shop names unique to this run: the binaries use the default key
	// prefix on a server other tests (and -count=2 reruns) share.
	run := redistest.KeyPrefix(t)
	shops := []string{"https://a-" + run + ".myshopify.com", "https://b-" + run + ".myshopify.com"}
	toks := []string{token(t, shops[0]), token(t, shops[1])}
	admitted := make([]map[int]int, len(shops))
	for s := range shops {
		// Four at a time: the answers rule admits 4 in flight per shop, and
		// this counts the minute rule.
		got, err := servicetest.Parallel(90, 4, func(i int) (int, error) {
			r, err := servicetest.Post(http.DefaultClient, urls[i%3]+"/api/chat", toks[s], question)
			return r.Status, err
		})
		if err != nil {
			t.Fatal(err)
		}
		admitted[s] = got
	}
	for s, got := range admitted {
		if got[200] != 30 || got[429] != 60 {
			t.Errorf("shop %d: statuses %v, want exactly 30 × 200 and 60 × 429 across the three instances", s, got)
		}
	}
	for i, p := range procs {
		if strings.Contains(p.Log(), "fail modes applied") {
			t.Errorf("instance %d failed open during the count:\n%s", i, p.Log())
		}
		p.Stop(t)
	}
}
