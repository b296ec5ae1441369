package bench

import (
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	credis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClusterChatRedisCPU is the Redis CPU one chat request costs on a
// three-master Cluster of its own (issue 30, item 5): the four per-shop
// rules and the address rule of examples/chat decided in one call, then,
// for an admitted request, the token settlement and the slot release in
// one more, as the limiter sends them. It reports, summed over the
// masters, cpu-us/req (used_cpu_sys + used_cpu_user, less what the nodes
// spent idle over as long, measured just before), srv-us/req (the usec of
// the script commands, INFO commandstats), scripts/req and nodes/req (the
// masters a request's calls reached, counted from the slots of its keys).
//
// The store cases send those calls to the Store directly, with the keys
// the limiter builds, "{tag}:rule" (layout=tagged), or the alternative
// digest of rule and value together, "rule:digest" (layout=rule-digest),
// which spreads a shop's rules over four slots: same scripts, same
// values, only the slots differ. "rejected" is a shop whose minute is
// spent: the call is refused, and what other slots took is refunded. The
// limiter case is the public path: the middleware with a key secret, the
// handler settling its tokens.
//
//	cd bench && go test -run '^$' -bench ClusterChatRedisCPU -benchtime 4000x -count 3
func BenchmarkClusterChatRedisCPU(b *testing.B) {
	cl := redistest.Cluster(b)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	b.Cleanup(func() { client.Close() })
	var masters []*redis.Client
	for _, n := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr, DisableIdentity: true})
		b.Cleanup(func() { c.Close() })
		masters = append(masters, c)
	}
	layouts := []struct {
		name string
		key  func(rule, value string) string
	}{
		{"rule-digest", func(rule, value string) string {
			sum := sha256.Sum256([]byte(rule + "\x00" + value))
			return rule + ":" + base64.RawURLEncoding.EncodeToString(sum[:16])
		}},
		{"tagged", func(rule, value string) string {
			sum := sha256.Sum256([]byte(value))
			return "{" + base64.RawURLEncoding.EncodeToString(sum[:16]) + "}:" + rule
		}},
	}
	for _, outcome := range []string{"admitted", "rejected"} {
		for _, lay := range layouts {
			b.Run(outcome+"/store/layout="+lay.name, func(b *testing.B) {
				pfx := prefix(b)
				s := credis.New(client, credis.WithPrefix(pfx), credis.WithDenyCache(0))
				req := func(i int) chatCall { return newChatCall(lay.key, i, outcome == "rejected") }
				if outcome == "rejected" {
					for i := range chatShops {
						c := req(i)
						c.decide[0].Limit = 1
						if _, err := s.Decide(ctx, c.decide[:1]); err != nil { // spends the shop's minute
							b.Fatal(err)
						}
					}
				}
				var nodes nodeCounter
				clusterCost(b, client, masters, &nodes, func(i int) {
					c := req(i)
					if outcome == "rejected" {
						c.decide[0].Limit = 1
					}
					nodes.add(b, pfx, c.decide)
					res, err := s.Decide(ctx, c.decide)
					if err != nil {
						b.Fatal(err)
					}
					if allowed := res[0].Allowed && res[1].Allowed && res[2].Allowed && res[3].Allowed && res[4].Allowed; allowed != (outcome == "admitted") {
						b.Fatalf("request %d: %+v, want admitted: %v", i, res, outcome == "admitted")
					}
					if outcome == "rejected" {
						return
					}
					c.settle[1].Stamp = res[3].Stamp
					if _, err := s.Decide(ctx, c.settle); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
	}
	b.Run("admitted/limiter", func(b *testing.B) {
		shop := ceiling.Header("X-Shop")
		l, err := ceiling.New([]ceiling.Rule{
			{Name: "chat:minute", Key: shop, Limit: 30, Period: time.Minute, Algorithm: ceiling.SlidingLog},
			{Name: "chat:day", Key: shop, Limit: 1000, Period: 24 * time.Hour, Algorithm: ceiling.SlidingLog},
			{Name: "chat:ip", Key: ceiling.RemoteAddr, Limit: 100, Period: time.Minute, Algorithm: ceiling.SlidingLog},
			{Name: "chat:tokens", Key: shop, Limit: 1_000_000, Period: 24 * time.Hour, Algorithm: ceiling.FixedWindow,
				Estimate: func(*http.Request) (int64, error) { return chatEstimate, nil }},
			{Name: "chat:answers", Key: shop, Limit: 4, Period: 30 * time.Second, Algorithm: ceiling.Concurrency},
		}, ceiling.WithBackend(credis.New(client, credis.WithPrefix(prefix(b)))), ceiling.WithTimeout(5*time.Second),
			ceiling.WithKeySecret([]byte("0123456789abcdef0123456789abcdef")))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := ceiling.Settle(r, "chat:tokens", chatUsed); err != nil {
				b.Error(err)
			}
		}))
		clusterCost(b, client, masters, nil, func(i int) {
			r := httptest.NewRequest("POST", "/api/chat", nil)
			r.Header.Set("X-Shop", chatShop(i))
			r.RemoteAddr = chatAddr(i) + ":4711"
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 200 {
				b.Fatalf("request %d: status %d", i, w.Code)
			}
		})
	})
}

// chatShops is how many shops the requests cycle through, each from an
// address of its own, so that no limit is reached at a few thousand
// requests a minute and a request finds its keys written, as in a
// service whose callers come back; chatEstimate and chatUsed are a request's token
// reservation and what it settles at.
const (
	chatShops    = 512
	chatEstimate = 2000
	chatUsed     = 300
)

func chatShop(i int) string { return "shop-" + strconv.Itoa(i%chatShops) }
func chatAddr(i int) string {
	return "198.51." + strconv.Itoa(i%chatShops>>8) + "." + strconv.Itoa(i%256)
}

// chatCall is a chat request's two calls as the limiter makes them: the
// decision, and the settlement with the slot release after the handler.
type chatCall struct {
	decide, settle []backend.Request
}

func newChatCall(key func(rule, value string) string, i int, rejected bool) chatCall {
	shop, addr := chatShop(i), chatAddr(i)
	lease := rand.Int64N(backend.MaxLease) + 1
	c := chatCall{decide: []backend.Request{
		{Key: key("chat:minute", shop), Algorithm: backend.SlidingLog, Limit: 30, Period: time.Minute, Cost: 1},
		{Key: key("chat:day", shop), Algorithm: backend.SlidingLog, Limit: 1000, Period: 24 * time.Hour, Cost: 1},
		{Key: key("chat:ip", addr), Algorithm: backend.SlidingLog, Limit: 100, Period: time.Minute, Cost: 1},
		{Key: key("chat:tokens", shop), Algorithm: backend.FixedWindow, Limit: 1_000_000, Period: 24 * time.Hour, Cost: chatEstimate},
		{Key: key("chat:answers", shop), Algorithm: backend.Concurrency, Limit: 4, Period: 30 * time.Second, Cost: 1, Lease: lease},
	}}
	if !rejected {
		c.settle = []backend.Request{
			{Key: c.decide[4].Key, Algorithm: backend.Concurrency, Limit: 4, Period: 30 * time.Second, Cost: -1, Lease: lease},
			{Key: c.decide[3].Key, Algorithm: backend.FixedWindow, Limit: 1_000_000, Period: 24 * time.Hour, Cost: chatUsed - chatEstimate},
		}
	}
	return c
}

// nodeCounter counts the masters a request's keys are on.
type nodeCounter struct {
	client *redis.ClusterClient
	n      atomic.Int64
}

func (c *nodeCounter) add(b *testing.B, pfx string, reqs []backend.Request) {
	b.Helper()
	seen := map[string]bool{}
	for _, r := range reqs {
		m, err := c.client.MasterForKey(ctx, pfx+":"+r.Key)
		if err != nil {
			b.Fatal(err)
		}
		seen[m.Options().Addr] = true
	}
	c.n.Add(int64(len(seen)))
}

// clusterCost runs b.N requests, one after another, and reports what the
// masters spent on them.
func clusterCost(b *testing.B, client *redis.ClusterClient, masters []*redis.Client, nodes *nodeCounter, run func(i int)) {
	if nodes != nil {
		nodes.client = client
	}
	for i := range chatShops { // loads the scripts on every master, writes every key
		run(i)
	}
	if nodes != nil {
		nodes.n.Store(0)
	}
	idleFrom := processCPU(b, masters)
	const idle = 500 * time.Millisecond
	time.Sleep(idle)
	idleRate := (processCPU(b, masters) - idleFrom) / float64(idle.Microseconds())
	cpu0 := processCPU(b, masters)
	calls0, usec0 := clusterScriptStats(b, masters)
	start := time.Now()
	b.ResetTimer()
	for i := range b.N {
		run(i)
	}
	b.StopTimer()
	took := time.Since(start)
	cpu := processCPU(b, masters) - cpu0 - idleRate*float64(took.Microseconds())
	calls, usec := clusterScriptStats(b, masters)
	b.ReportMetric(cpu/float64(b.N), "cpu-us/req")
	b.ReportMetric(float64(usec-usec0)/float64(b.N), "srv-us/req")
	b.ReportMetric(float64(calls-calls0)/float64(b.N), "scripts/req")
	if nodes != nil {
		b.ReportMetric(float64(nodes.n.Load())/float64(b.N), "nodes/req")
	}
}

// clusterScriptStats sums scriptStats over the masters.
func clusterScriptStats(b *testing.B, masters []*redis.Client) (calls, usec int64) {
	for _, m := range masters {
		c, u := scriptStats(b, m)
		calls, usec = calls+c, usec+u
	}
	return calls, usec
}

// processCPU is the CPU time the masters' redis-server processes have
// used, every thread, in µs (INFO cpu: used_cpu_sys + used_cpu_user).
func processCPU(b *testing.B, masters []*redis.Client) float64 {
	b.Helper()
	var total float64
	for _, m := range masters {
		info, err := m.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatalf("INFO cpu: %v", err)
		}
		found := 0
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu line %q: %v", line, err)
			}
			total += f * 1e6
			found++
		}
		if found != 2 {
			b.Fatalf("INFO cpu of %s has no used_cpu_sys and used_cpu_user: %q", m.Options().Addr, info)
		}
	}
	return total
}
