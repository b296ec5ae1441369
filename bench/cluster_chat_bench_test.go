package bench

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
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
// masters a request's calls reached, counted from the slots of its keys),
// from one goroutine (par=1) or from 16 (par=16), whose calls share
// pipelined round trips.
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
//	cd bench && go test -run '^$' -bench ClusterChatRedisCPU -benchtime 3000x -count 3
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
			for _, par := range []int{1, 16} {
				b.Run(outcome+"/store/layout="+lay.name+"/par="+strconv.Itoa(par), func(b *testing.B) {
					pfx := prefix(b)
					s := credis.New(client, credis.WithPrefix(pfx), credis.WithDenyCache(0))
					req := func(i int) chatCall {
						c := newChatCall(lay.key, i, outcome == "rejected")
						if outcome == "rejected" {
							c.decide[0].Limit = 1
						}
						return c
					}
					if outcome == "rejected" {
						for i := range chatShops {
							if _, err := s.Decide(ctx, req(i).decide[:1]); err != nil { // spends the shop's minute
								b.Fatal(err)
							}
						}
					}
					nodes := &nodeCounter{client: client}
					clusterCost(b, masters, nodes, par, func(i int) error {
						c := req(i)
						if err := nodes.add(pfx, c.decide); err != nil {
							return err
						}
						res, err := s.Decide(ctx, c.decide)
						if err != nil {
							return err
						}
						if allowed := res[0].Allowed && res[1].Allowed && res[2].Allowed && res[3].Allowed && res[4].Allowed; allowed != (outcome == "admitted") {
							return fmt.Errorf("request %d: %+v, want admitted: %v", i, res, outcome == "admitted")
						}
						if outcome == "rejected" {
							return nil
						}
						c.settle[1].Stamp = res[3].Stamp
						_, err = s.Decide(ctx, c.settle)
						return err
					})
				})
			}
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
		clusterCost(b, masters, nil, 1, func(i int) error {
			r := httptest.NewRequest("POST", "/api/chat", nil)
			r.Header.Set("X-Shop", chatShop(i))
			r.RemoteAddr = chatAddr(i) + ":4711"
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 200 {
				return fmt.Errorf("request %d: status %d", i, w.Code)
			}
			return nil
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

func (c *nodeCounter) add(pfx string, reqs []backend.Request) error {
	var seen []string
	for _, r := range reqs {
		m, err := c.client.MasterForKey(ctx, pfx+":"+r.Key)
		if err != nil {
			return err
		}
		if a := m.Options().Addr; !slices.Contains(seen, a) {
			seen = append(seen, a)
		}
	}
	c.n.Add(int64(len(seen)))
	return nil
}

// clusterCost runs b.N requests from par goroutines (one after another
// for par 1) and reports what the masters spent on them.
func clusterCost(b *testing.B, masters []*redis.Client, nodes *nodeCounter, par int, run func(i int) error) {
	for i := range chatShops { // loads the scripts on every master, writes every key
		if err := run(i); err != nil {
			b.Fatal(err)
		}
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
	if par == 1 {
		for i := range b.N {
			if err := run(i); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism(max(1, par/runtime.GOMAXPROCS(0)))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := run(int(next.Add(1) - 1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
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
