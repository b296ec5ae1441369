package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// script is one script run that a Cluster node answered: the node and the
// keys it was sent.
type script struct {
	node string
	keys []string
	eval bool // an EVAL: the Store sends one only for an FCALL or EVALSHA the node could not run
}

// scriptLog records every script a Cluster client's nodes were sent
// (FCALL, EVALSHA or EVAL) and tells how many ran: the Store sends an EVAL
// only after an FCALL or EVALSHA of the same keys that the node could not
// run (it had not seen the library or the script), and that pair is one
// run.
type scriptLog struct {
	mu   sync.Mutex
	runs []script
}

// logScripts installs a scriptLog on every node client of client.
func logScripts(t *testing.T, client *redis.ClusterClient) *scriptLog {
	t.Helper()
	l := &scriptLog{}
	var mu sync.Mutex
	hooked := map[*redis.Client]bool{}
	add := func(n *redis.Client) {
		mu.Lock()
		defer mu.Unlock()
		if !hooked[n] {
			hooked[n] = true
			n.AddHook(&nodeHook{log: l, node: n.Options().Addr})
		}
	}
	client.OnNewNode(add)
	if err := client.ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error {
		add(n)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// take returns the scripts run since the last take, and forgets them.
func (l *scriptLog) take() []script {
	l.mu.Lock()
	defer l.mu.Unlock()
	var runs []script
	for _, r := range l.runs {
		if r.eval {
			at := slices.IndexFunc(runs, func(e script) bool { return e.node == r.node && slices.Equal(e.keys, r.keys) })
			if at < 0 {
				panic(fmt.Sprintf("an EVAL of %v on %s without an FCALL or EVALSHA before it", r.keys, r.node))
			}
			runs = slices.Delete(runs, at, at+1)
		}
		runs = append(runs, r)
	}
	l.runs = nil
	return runs
}

type nodeHook struct {
	log  *scriptLog
	node string
}

func (h *nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(cmd)
		return next(ctx, cmd)
	}
}

func (h *nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *nodeHook) record(cmd redis.Cmder) {
	args := cmd.Args()
	if name := cmd.Name(); (name != "fcall" && name != "evalsha" && name != "eval") || len(args) < 3 {
		return
	}
	n, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || len(args) < 3+n {
		return
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(args[3+i])
	}
	h.log.mu.Lock()
	h.log.runs = append(h.log.runs, script{node: h.node, keys: keys, eval: cmd.Name() == "eval"})
	h.log.mu.Unlock()
}

// tagOf is the hash tag of a stored key, prefix:{tag}:rule.
func tagOf(key string) string {
	_, rest, _ := strings.Cut(key, "{")
	tag, _, _ := strings.Cut(rest, "}")
	return tag
}

// chatRules are examples/chat's rules, scaled down: four per shop (a
// minute and a day log, a token budget reserved before and settled after,
// and answers in flight) and one per address.
func chatRules(perMinute int64) []ceiling.Rule {
	shop := ceiling.Header("X-Shop")
	return []ceiling.Rule{
		{Name: "chat:minute", Key: shop, Limit: perMinute, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "chat:day", Key: shop, Limit: 1000, Period: 24 * time.Hour, Algorithm: ceiling.SlidingLog},
		{Name: "chat:ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, Algorithm: ceiling.SlidingLog},
		{Name: "chat:tokens", Key: shop, Limit: 1_000_000, Period: 24 * time.Hour, Algorithm: ceiling.FixedWindow,
			Estimate: func(*http.Request) (int64, error) { return 2000, nil }},
		{Name: "chat:answers", Key: shop, Limit: 4, Period: 30 * time.Second, Algorithm: ceiling.Concurrency},
	}
}

// chatHandler is a chat service behind rules: it settles the tokens the
// model used.
func chatHandler(t *testing.T, rules []ceiling.Rule, s *ceilingredis.Store) (*ceiling.Limiter, http.Handler) {
	t.Helper()
	l, err := ceiling.New(rules, ceiling.WithBackend(s), ceiling.WithTimeout(5*time.Second),
		ceiling.WithKeySecret([]byte("0123456789abcdef0123456789abcdef")), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := ceiling.Settle(r, "chat:tokens", 300); err != nil {
			t.Errorf("Settle: %v", err)
		}
	}))
}

func chatRequest(t *testing.T, h http.Handler, shop, addr string) int {
	t.Helper()
	r := httptest.NewRequest("POST", "/api/chat", nil)
	r.Header.Set("X-Shop", shop)
	r.RemoteAddr = addr + ":4711"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestChatRequestTouchesAtMostTwoNodes pins issue 30's fifth item on a
// real three-master Cluster: a chat request's four shop rules are decided
// in one script (one slot, one node) and its address rule in another, and
// the settlement and slot release after the handler are one more script on
// the shop's node: three scripts on at most two nodes, where keys of the
// form prefix:rule:digest took five scripts to decide (up to three nodes)
// and two to settle. Every stored key holds a tag and a rule name, never
// the shop or the address.
func TestChatRequestTouchesAtMostTwoNodes(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	log := logScripts(t, client)
	_, h := chatHandler(t, chatRules(30), ceilingredis.New(client, ceilingredis.WithPrefix(prefix)))

	nodes := map[string]bool{}
	for i := range 12 {
		shop, addr := "shop-"+strconv.Itoa(i), "192.0.2."+strconv.Itoa(i+1)
		if code := chatRequest(t, h, shop, addr); code != 200 {
			t.Fatalf("%s from %s: status %d, want 200", shop, addr, code)
		}
		runs := log.take()
		if len(runs) != 3 {
			t.Fatalf("%s: %d scripts %v, want 3: the shop's rules, the address's, the settlement with the release", shop, len(runs), runs)
		}
		var shopRuns, ipRuns []script
		for _, r := range runs {
			for _, k := range r.keys {
				if tagOf(k) != tagOf(r.keys[0]) {
					t.Errorf("%s: one script over two tags: %v", shop, r.keys)
				}
			}
			if strings.HasSuffix(r.keys[0], ":chat:ip") {
				ipRuns = append(ipRuns, r)
			} else {
				shopRuns = append(shopRuns, r)
			}
		}
		if len(shopRuns) != 2 || len(ipRuns) != 1 || len(shopRuns[0].keys) != 5 || len(shopRuns[1].keys) != 3 || len(ipRuns[0].keys) != 1 ||
			!strings.Contains(shopRuns[0].keys[4], "#o") || shopRuns[1].keys[2] != shopRuns[0].keys[4] {
			t.Fatalf("%s: scripts %v, want the shop's 4 keys and its token reservation's ticket, the address's 1, then the shop's tokens and answers and that ticket", shop, runs)
		}
		if tagOf(shopRuns[0].keys[0]) != tagOf(shopRuns[1].keys[0]) || shopRuns[0].node != shopRuns[1].node {
			t.Errorf("%s: the settlement went to %v, the decision to %v", shop, shopRuns[1], shopRuns[0])
		}
		touched := map[string]bool{}
		for _, r := range runs {
			touched[r.node] = true
			nodes[r.node] = true
		}
		if len(touched) > 2 {
			t.Errorf("%s: %d nodes touched, want at most 2", shop, len(touched))
		}
	}
	if len(nodes) < 2 {
		t.Errorf("12 shops and addresses reached %d nodes: the test spreads nothing", len(nodes))
	}

	ctx := context.Background()
	var stored []string
	var mu sync.Mutex
	if err := client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, prefix+":*").Result()
		mu.Lock()
		defer mu.Unlock()
		stored = append(stored, keys...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Per shop: the two logs and the token window (the answers' leases are
	// gone once released, and the ticket of its token reservation,
	// backend.Request.Once, once its refund consumed it), in the shop's
	// slot; per address: its log.
	if got, want := len(stored), 12*3+12; got != want {
		t.Errorf("%d stored keys, want %d: %v", got, want, stored)
	}
	for _, k := range stored {
		if !strings.HasPrefix(k, prefix+":{") || len(tagOf(k)) != 22 || strings.Contains(k, "shop") || strings.Contains(k, "192.0.2") {
			t.Errorf("stored key %q: want prefix:{22-character tag}:rule, nothing raw", k)
		}
	}
}

// TestSameValueRejectionRefundsNoOtherSlot pins the refunds issue 30's
// fifth item removes: a request rejected by one of a shop's rules is
// decided in one script, which writes nothing, so no other slot of the
// shop has anything to give back. Only a rule of another value (the
// address) is refunded, in one script of its own slot. Before, the shop's
// four rules were four slots: a rejection by one of them cost four
// scripts and a refund of each of the three others.
func TestSameValueRejectionRefundsNoOtherSlot(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	log := logScripts(t, client)
	all := chatRules(2)
	shopOnly := slices.DeleteFunc(slices.Clone(all), func(r ceiling.Rule) bool { return r.Name == "chat:ip" })

	for i, tc := range []struct {
		name    string
		rules   []ceiling.Rule
		scripts int // for the rejected request
	}{
		{"the shop's rules alone", shopOnly, 1},
		{"with the address rule", all, 3}, // two decisions, the address's refund
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, h := chatHandler(t, tc.rules, ceilingredis.New(client, ceilingredis.WithPrefix(prefix+strconv.Itoa(i)), ceilingredis.WithDenyCache(0)))
			for i, want := range []int{200, 200, 429} {
				if code := chatRequest(t, h, "shop-1", "192.0.2.1"); code != want {
					t.Fatalf("request %d: status %d, want %d", i+1, code, want)
				}
				runs := log.take()
				if i < 2 {
					continue
				}
				shopRuns := slices.DeleteFunc(slices.Clone(runs), func(r script) bool { return strings.HasSuffix(r.keys[0], ":chat:ip") })
				if len(runs) != tc.scripts || len(shopRuns) != 1 {
					t.Errorf("rejected request: %d scripts %v, want %d, one of them the shop's", len(runs), runs, tc.scripts)
				}
			}
			// The rejection consumed nothing: the day log, the token
			// window and the address's log hold the two admitted requests
			// only.
			ctx := context.Background()
			for _, peek := range []struct {
				rule, value string
				used        int64
			}{{"chat:day", "shop-1", 2}, {"chat:tokens", "shop-1", 2 * 300}, {"chat:ip", "192.0.2.1", 2}} {
				if !slices.ContainsFunc(tc.rules, func(r ceiling.Rule) bool { return r.Name == peek.rule }) {
					continue
				}
				res, err := l.Peek(ctx, peek.rule, peek.value)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := res.Limit-res.Remaining, peek.used; got != want {
					t.Errorf("%s: %d used, want %d", peek.rule, got, want)
				}
			}
			log.take()
		})
	}
}

// TestSpentShopIsAnsweredFromTheDenyCacheOnCluster: a shop's rules are one
// slot, so the rejection of a shop whose minute is spent is not a call
// split across slots, which the deny cache never learns: the shop's next
// requests are refused in process, at no cost to Redis. With the shop's
// rules in four slots, each of them cost four scripts and three refunds.
func TestSpentShopIsAnsweredFromTheDenyCacheOnCluster(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	log := logScripts(t, client)
	shopOnly := slices.DeleteFunc(chatRules(2), func(r ceiling.Rule) bool { return r.Name == "chat:ip" })
	_, h := chatHandler(t, shopOnly, ceilingredis.New(client, ceilingredis.WithPrefix(redistest.KeyPrefix(t))))
	var codes []int
	for range 3 {
		codes = append(codes, chatRequest(t, h, "shop-1", "192.0.2.1"))
	}
	log.take()
	for range 5 {
		codes = append(codes, chatRequest(t, h, "shop-1", "192.0.2.1"))
	}
	if want := []int{200, 200, 429, 429, 429, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("statuses %v, want %v", codes, want)
	}
	if runs := log.take(); len(runs) != 0 {
		t.Errorf("a spent shop's requests after its rejection ran %d scripts %v, want none", len(runs), runs)
	}
}
