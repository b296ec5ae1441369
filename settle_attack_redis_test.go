package ceiling

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A key's stored state is meant to stay small and bounded whatever the
// traffic (DESIGN.md: "small bounded state per key"), but every settlement
// to a remote backend left a record beside its key, whether or not its
// reply was ever lost. A refund gives its units back, so the rule does not
// bound how many settlements one key makes: a client whose requests each
// reserve and then settle 0 (a handler that settles what it used, nothing,
// on a bad input or a client gone) is admitted without end. Kept twice the
// Period, one shop of limit 3 per day left one Redis key per request for
// 48 hours. A reservation now writes a ticket, which its refund consumes,
// leaving nothing: here one shop makes 200 requests, all admitted, and no
// entry of a settlement is left.
func TestSettlementRecordsBoundedPerKey_Regression(t *testing.T) {
	l, _, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 3, Period: 24 * time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 3, nil }}})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
	}))
	const n = 200
	admitted := 0
	for range n {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", "acme")
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	keys, err := direct.Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, k := range keys {
		if strings.Contains(k, "#o") {
			records++
		}
	}
	t.Logf("%d of %d admitted; %d keys in Redis, %d of them tickets or records", admitted, n, len(keys), records)
	if admitted != n {
		t.Fatalf("%d of %d admitted; each settled 0 and should have left the budget whole", admitted, n)
	}
	if records != 0 {
		t.Errorf("one key of a daily rule holds %d tickets or records after %d reservations refunded in full: want none", records, n)
	}
}

// A settlement is resent for a Period after its call failed, and its record
// on Redis lasts twice that Period after it was applied, so a repeat always
// finds it. But the request's settlements for rules of different Periods
// share one resend deadline, the longest Period's: a short rule's
// settlement is resent after its own record lapsed and is applied again.
// Here a request settles 6 against estimates of 1 under a 1 s rule and a
// one-hour rule, in one call whose reply is lost after Redis applied both;
// Redis is then unreachable for 2.5 s. On recovery the resend charged the
// 1 s rule's 5 units a second time (its record, 2 s, had lapsed): the shop
// billed twice, and its next requests refused.
func TestSettlementResentPastItsRecordMixedPeriods_Regression(t *testing.T) {
	est := func(*http.Request) (int64, error) { return 1, nil }
	l, proxy, _ := proxiedLimiter(t, []Rule{
		{Name: "burst", Key: headerKey("X-Shop"), Limit: 10, Period: time.Second, Estimate: est},
		{Name: "hourly", Key: headerKey("X-Shop"), Limit: 100, Period: time.Hour, Estimate: est},
	})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, rule := range []string{"burst", "hourly"} {
			if err := Settle(r, rule, 6); err != nil {
				t.Errorf("Settle %s: %v", rule, err)
			}
		}
		proxy.DropReply("fcall") // the settlement's reply, after Redis applied it
	}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Shop", "acme")
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || proxy.Dropped() != 1 {
		t.Fatalf("status %d, %d replies lost; want 200 and 1", w.Code, proxy.Dropped())
	}
	proxy.Partition()
	proxy.Cut()
	time.Sleep(2500 * time.Millisecond) // real time: Redis's own TTLs; the burst rule's record lapses
	proxy.Heal()
	if !eventually(func() bool { return l.pendingWrites() == 0 }) {
		t.Fatal("the settlement is still pending a resend after 10 s")
	}
	res, err := l.Peek(t.Context(), "burst", "acme")
	if err != nil || res.Remaining != 10 {
		t.Errorf("burst rule 2.5 s after its only request: %+v, %v; want 10 left (its charge applied once, expired since)", res, err)
	}
	res, err = l.Peek(t.Context(), "hourly", "acme")
	if err != nil || res.Remaining != 94 {
		t.Errorf("hourly rule: %+v, %v; want 94 left (6 charged once)", res, err)
	}
}

// A refund resent after Redis restarted empty found no record of its first
// delivery, and gave back units taken since the restart at its stamp:
// another request's quota, past the documented cost of a restart ("each
// restart lets each key admit up to one more Limit"). A refund now applies
// only beside its reservation's ticket, written with the admission, which
// dies in the restart with the units it stands for. Instance 1 reserves
// the whole budget, 10 of 10 per hour (FixedWindow), and settles 0: Redis
// applies the refund, the reply is lost and instance 1 is cut off from
// Redis. Instance 2 then takes 10; Redis restarts empty; instance 2 takes
// 10 more (the restart's one more Limit). Instance 1 comes back and resends
// its refund, which gave back those 10; instance 2 took 10 again: 30 in
// one window of a limit of 10. Now the resent refund finds no ticket and
// gives back nothing.
func TestRefundResentAfterRestartBuysNoQuota_Attack(t *testing.T) {
	inst := redistest.Server(t)
	withLibrary(t, inst.Client(t))
	proxy := redistest.NewProxy(t, inst.Addr)
	prefix := redistest.KeyPrefix(t)
	secret := WithKeySecret(bytes.Repeat([]byte("k"), 32))
	rules := []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10, Period: time.Hour, Algorithm: FixedWindow,
		Estimate: func(*http.Request) (int64, error) { return 10, nil }}}
	limiter := func(addr string) *Limiter {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		l := MustNew(rules, WithBackend(ceilingredis.New(c, ceilingredis.WithPrefix(prefix))), secret,
			WithTimeout(500*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		t.Cleanup(func() { l.Close() })
		return l
	}
	l1, l2 := limiter(proxy.Addr), limiter(inst.Addr)
	direct := inst.Client(t)
	ctx := t.Context()
	window := time.Now().Truncate(time.Hour)

	var reserved atomic.Bool
	h := l1.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if keys, _ := direct.Keys(ctx, prefix+"*#o*").Result(); len(keys) != 1 {
			t.Errorf("the reservation left %d tickets, want 1", len(keys))
		}
		reserved.Store(true)
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
		proxy.LoseReplyLate("fcall") // the settlement's reply
	}))
	done := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", "acme")
		h.ServeHTTP(w, r)
		done <- w.Code
	}()
	tickets := func() int {
		keys, _ := direct.Keys(ctx, prefix+"*#o*").Result()
		return len(keys)
	}
	// The handler runs beside the reservation's ticket; the refund,
	// applied, consumes it.
	applied := eventually(func() bool { return reserved.Load() && tickets() == 0 })
	proxy.Partition() // instance 1 loses the reply, and Redis
	if code := <-done; !applied || code != http.StatusOK {
		t.Fatalf("status %d, refund applied %v; want 200, applied", code, applied)
	}
	take := func(who string, want bool) {
		t.Helper()
		var d Decision
		var err error
		for range 50 { // instance 2's connection may die with the restart
			if d, err = l2.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 10}); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil || d.Allowed != want {
			t.Errorf("%s takes 10: %+v, %v; want allowed %v", who, d, err, want)
		}
	}
	take("B, after A's refund", true)
	inst.Restart(t)
	take("C, after the restart", true)
	proxy.Heal()
	if !eventually(func() bool { return l1.pendingWrites() == 0 }) {
		t.Fatal("the refund is still pending after 10 s")
	}
	take("D, after A's refund was resent", false)
	if time.Now().Truncate(time.Hour) != window {
		t.Skip("the test crossed an hour's window boundary; run it again")
	}
}

// The records of finding TestSettlementRecordsBoundedPerKey_Regression were
// a flood any client can make: requests that reserve and settle 0 filled
// Redis with records (living twice the Period, then at most a minute), one
// key of the attacker's, until Redis, full (noeviction, as the README
// asks), refused every write and every other caller's decision went to
// the fail mode. Here Redis has 512 KiB of room, which the attacker's
// requests, each admitted, filled within this bounded loop; then another
// shop's request was decided by FailLocal. A refund now consumes its
// reservation's ticket and leaves nothing, so the loop ends with Redis
// holding the attacker's one state and the victim is decided by Redis.
func TestSettlementRecordsFillRedis_Attack(t *testing.T) {
	l, _, direct := proxiedLimiter(t, []Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 3, Period: 24 * time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 3, nil }}})
	ctx := t.Context()
	mem, err := direct.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, line := range strings.Split(mem, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if err := direct.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+512<<10, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Once Redis is full, the fail mode admits without a reservation.
		if err := Settle(r, "tokens", 0); err != nil && !errors.Is(err, ErrNotReserved) {
			t.Errorf("Settle: %v", err)
		}
	}))
	serve := func(shop string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-Shop", shop)
		h.ServeHTTP(w, r)
		return w
	}
	fallbacks := func() int64 { r := l.Health().Rules[0]; return r.FailOpenAdmissions + r.FailLocalAdmissions }
	n := 0
	for ; n < 20000 && fallbacks() == 0; n++ {
		if w := serve("attacker"); w.Code != http.StatusOK {
			break
		}
	}
	keys, _ := direct.DBSize(ctx).Result()
	before := fallbacks()
	w := serve("victim")
	t.Logf("%d requests of one shop, %d Redis keys; victim: %d, fallbacks %d -> %d", n, keys, w.Code, before, fallbacks())
	if w.Code != http.StatusOK || fallbacks() != before {
		t.Errorf("after one shop's %d settle-0 requests (%d keys in Redis), another shop's request got %d, decided by the fail mode: %v",
			n, keys, w.Code, fallbacks() != before)
	}
}

// Charge is the non-HTTP Settle, but its settlements carried no Once and
// were not resent: a stamped refund whose reply was lost failed with
// "backend unreachable", though Redis applied it, and its doc left the
// retry to the caller. The retry was applied a second time and gave back
// another caller's units: A reserves 5 and B takes 5 of 10, A's Charge
// refund of 5 loses its reply, A retries it, and 10 were left with B's 5
// still in use. A Decide input now asks for a ticket (Reserve), and the
// Charge refund that passes it (Ticket) is named by it and resent; its
// error says so (ErrResent), and the caller repeats only what the doc says
// was not applied.
func TestChargeRefundRetriedAfterLostReplyBuysNoQuota_Attack(t *testing.T) {
	l, proxy, _ := proxiedLimiter(t, []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}})
	ctx := t.Context()
	a, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5, Reserve: true})
	if err != nil || !a.Allowed || a.Results[0].Ticket == 0 {
		t.Fatalf("A reserves 5 with a ticket: %+v, %v", a, err)
	}
	if b, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5}); err != nil || !b.Allowed || b.Results[0].Ticket != 0 {
		t.Fatalf("B takes 5, asking no ticket: %+v, %v", b, err)
	}
	refund := Input{Rule: "tokens", Key: "acme", Cost: -5, Stamp: a.Results[0].Stamp, Ticket: a.Results[0].Ticket}
	proxy.DropReply("fcall")
	resent := false
	for try := 0; try < 3; try++ { // retried while the doc says it was not applied
		err = l.Charge(ctx, refund)
		t.Logf("try %d: %v", try, err)
		if err == nil || errors.Is(err, ErrResent) {
			resent = err != nil
			break
		}
		if !errors.Is(err, ErrDegraded) && !errors.Is(err, backend.ErrNotSent) {
			t.Fatalf("the refund failed with %v: neither resent nor surely unapplied, so not safe to retry", err)
		}
	}
	if !resent || proxy.Dropped() != 1 {
		t.Fatalf("the refund whose reply was lost: %v, %d replies lost; want an error wrapping ErrResent", err, proxy.Dropped())
	}
	if !eventually(func() bool { return l.pendingWrites() == 0 }) {
		t.Fatal("the refund is still pending a resend after 10 s")
	}
	if p, err := l.Peek(ctx, "tokens", "acme"); err != nil || p.Remaining != 5 {
		t.Errorf("after A's refund: %+v, %v; want 5 left (B's 5 still count)", p, err)
	}
}

// A Charge refund without a ticket is applied as sent: it cannot be told
// from a second delivery, so one whose reply was lost is not sent again,
// and its error says it may have been applied (not ErrResent, nor
// ErrDegraded or ErrNotSent, which would invite a repeat). A refund with
// a ticket that a restart lost, or that an earlier delivery consumed,
// gives back nothing: A reserves 5 with a ticket and B takes 5; A's
// refund, applied, frees A's 5, and sent again gives back none of B's.
func TestChargeRefundWithoutTicketIsNotResent(t *testing.T) {
	l, proxy, _ := proxiedLimiter(t, []Rule{{Name: "tokens", Limit: 10, Period: time.Hour, Algorithm: FixedWindow}})
	ctx := t.Context()
	a, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5})
	if err != nil || !a.Allowed || a.Results[0].Ticket != 0 {
		t.Fatalf("A reserves 5 without a ticket: %+v, %v", a, err)
	}
	proxy.DropReply("fcall")
	err = l.Charge(ctx, Input{Rule: "tokens", Key: "acme", Cost: -5, Stamp: a.Results[0].Stamp})
	if err == nil || errors.Is(err, ErrResent) || errors.Is(err, ErrDegraded) || errors.Is(err, backend.ErrNotSent) || proxy.Dropped() != 1 {
		t.Fatalf("a ticketless refund whose reply was lost: %v (%d replies lost); want an error saying it may have been applied", err, proxy.Dropped())
	}
	if n := l.pendingWrites(); n != 0 {
		t.Errorf("%d writes pending: a ticketless refund must not be sent again", n)
	}
	if p, err := l.Peek(ctx, "tokens", "acme"); err != nil || p.Remaining != 10 {
		t.Errorf("after the refund Redis applied: %+v, %v; want 10 left", p, err)
	}

	c, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5, Reserve: true})
	if err != nil || !c.Allowed || c.Results[0].Ticket == 0 {
		t.Fatalf("C reserves 5 with a ticket: %+v, %v", c, err)
	}
	if d, err := l.Decide(ctx, Input{Rule: "tokens", Key: "acme", Cost: 5}); err != nil || !d.Allowed {
		t.Fatalf("D takes 5: %+v, %v", d, err)
	}
	refund := Input{Rule: "tokens", Key: "acme", Cost: -5, Stamp: c.Results[0].Stamp, Ticket: c.Results[0].Ticket}
	for i := range 2 {
		if err := l.Charge(ctx, refund); err != nil {
			t.Fatalf("C's refund (%d): %v", i+1, err)
		}
	}
	if p, err := l.Peek(ctx, "tokens", "acme"); err != nil || p.Remaining != 5 {
		t.Errorf("after C's refund sent twice: %+v, %v; want 5 left (D's 5 still count)", p, err)
	}
}
