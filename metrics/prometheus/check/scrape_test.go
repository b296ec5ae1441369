package check_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/storage"
)

// stub is a remote backend that admits everything, hangs until its
// context ends, fails at once, or is never sent the call (this process is
// too busy: the request is shed), as told.
type stub struct {
	mu   sync.Mutex
	mode string // "", "hang", "fail" or "notsent"
}

func (s *stub) set(mode string) {
	s.mu.Lock()
	s.mode = mode
	s.mu.Unlock()
}

func (s *stub) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	s.mu.Lock()
	mode := s.mode
	s.mu.Unlock()
	switch mode {
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	case "fail":
		return nil, errors.New("dial tcp 127.0.0.1:1: connection refused")
	case "notsent":
		return nil, fmt.Errorf("pool exhausted: %w", backend.ErrNotSent)
	}
	out := make([]backend.Result, len(reqs))
	for i, r := range reqs {
		out[i] = backend.Result{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Cost}
	}
	return out, nil
}

func (*stub) Reset(context.Context, ...string) error { return nil }

var ok = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

func get(h http.Handler, n int) {
	for range n {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
}

// A recording is what Prometheus would have scraped from one process, a
// scrape per simulated minute, with the target labels a scrape adds.
type recording struct {
	t       *testing.T
	url     string
	series  map[string][]string // series → value per scrape, "_" where absent
	scrapes int
	last    string
}

const target = `instance="app-1:8080",job="api"`

func newRecording(t *testing.T, obs *ceilingprom.Observer) *recording {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(obs)
	return recordingOf(t, reg)
}

// recordingOf records what g exposes: ceilingprom's registry, or another
// exporter's that must drive the same alerts and panels.
func recordingOf(t *testing.T, g prometheus.Gatherer) *recording {
	srv := httptest.NewServer(promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return &recording{t: t, url: srv.URL, series: map[string][]string{}}
}

// scrape reads the exposition over HTTP, as Prometheus does, and records
// each series' value.
func (r *recording) scrape() {
	r.t.Helper()
	resp, err := http.Get(r.url)
	if err != nil {
		r.t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		r.t.Fatal(err)
	}
	r.last = string(body)
	sc := bufio.NewScanner(strings.NewReader(r.last))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series, value := line[:i], line[i+1:]
		if name, labels, found := strings.Cut(series, "{"); found {
			series = name + "{" + target + "," + labels
		} else {
			series += "{" + target + "}"
		}
		vs, seen := r.series[series]
		if !seen {
			vs = slices.Repeat([]string{"_"}, r.scrapes)
		}
		r.series[series] = append(vs, value)
	}
	r.scrapes++
	for s, vs := range r.series {
		if len(vs) < r.scrapes {
			r.series[s] = append(vs, "_")
		}
	}
}

// load is the recording as a promqltest load command, a scrape a minute
// from 0m.
func (r *recording) load() string {
	var b strings.Builder
	b.WriteString("load 1m\n")
	for _, s := range slices.Sorted(maps.Keys(r.series)) {
		fmt.Fprintf(&b, "  %s %s\n", s, strings.Join(r.series[s], " "))
	}
	return b.String()
}

// names are the series names the last scrape showed (a histogram's
// _bucket, _sum and _count).
func (r *recording) names() map[string]bool {
	out := map[string]bool{}
	for s := range r.series {
		name, _, _ := strings.Cut(s, "{")
		out[name] = true
	}
	return out
}

var quiet = ceiling.WithLogger(slog.New(slog.DiscardHandler))

// healthy records six minutes of a limiter whose remote backend answers
// every call.
func healthy(t *testing.T) *recording {
	obs := ceilingprom.New(ceilingprom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	rec := newRecording(t, obs)
	recordHealthy(t, obs, rec)
	return rec
}

// recordHealthy records into rec six minutes of a limiter observed by obs
// whose remote backend answers every call.
func recordHealthy(t *testing.T, obs ceiling.Observer, rec *recording) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "shop", Key: ceiling.Static("s"), Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailLocal},
	}, ceiling.WithBackend(&stub{}), ceiling.WithObserver(obs), ceiling.WithTimeout(time.Second), quiet)
	t.Cleanup(func() { l.Close() })
	rec.scrape()
	for range 6 {
		get(l.Handler(ok), 20)
		rec.scrape()
	}
}

// outage records a process with five limiters on one observer: one on the
// memory store, whose rules reject and spare each other (every decision
// outcome), and one on a remote backend that is healthy for five minutes,
// then times out on one call in two, fails, flaps between degraded and
// healthy three times and stays degraded while its rules' fail modes admit;
// meanwhile a third, on a small memory store, meets a flood of fresh keys,
// a fourth, failing closed on the failed backend, refuses with 503, and a
// fifth sheds with 503, too busy to send its calls.
func outage(t *testing.T) *recording {
	obs := ceilingprom.New(ceilingprom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	local, flooded := memoryLimiters(t, obs)
	busy, shedding := sheddingLimiter(t, obs)

	be := &stub{}
	const timeout = 5 * time.Millisecond
	remote := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "shop", Key: ceiling.Static("s"), Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailLocal},
	}, ceiling.WithBackend(be), ceiling.WithObserver(obs), ceiling.WithTimeout(timeout),
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 3, CoolDown: 10 * time.Millisecond, MaxCoolDown: 10 * time.Millisecond}), quiet)
	t.Cleanup(func() { remote.Close() })
	h := remote.Handler(ok)
	closed := failingClosed(t, be, obs)

	rec := newRecording(t, obs)
	rec.scrape()
	for range 5 { // 0m–5m: healthy
		get(local.Handler(ok), 3)
		get(h, 5)
		get(closed, 5)
		get(shedding, 5)
		rec.scrape()
	}
	// 6m: ten calls time out, each followed by an answered one (so the
	// breaker stays closed), then the backend refuses: degraded. It
	// recovers and fails twice more.
	for range 10 {
		be.set("hang")
		get(h, 1)
		be.set("")
		get(h, 1)
	}
	for i := range 3 {
		be.set("fail")
		waitFor(t, remote, "degraded", func() { get(h, 1) })
		if i < 2 {
			be.set("")
			waitFor(t, remote, "healthy", func() { get(h, 1) })
		}
	}
	// Admitted by the fail modes, refused failing closed, shed by a busy
	// process, and a flood of fresh keys on the small store.
	busy.set("notsent")
	get(h, 5)
	get(closed, 5)
	get(shedding, 100)
	flood(flooded)
	rec.scrape()
	get(h, 5) // 7m: still degraded
	get(closed, 5)
	get(shedding, 100)
	rec.scrape()
	return rec
}

// failingClosed is the handler of a limiter on be, observed by obs, whose
// one rule fails closed: while be fails, it refuses with 503.
func failingClosed(t *testing.T, be backend.Backend, obs ceiling.Observer) http.Handler {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "pay", Key: ceiling.RemoteAddr, Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailClosed},
	}, ceiling.WithBackend(be), ceiling.WithObserver(obs), ceiling.WithTimeout(100*time.Millisecond), quiet)
	t.Cleanup(func() { l.Close() })
	return l.Handler(ok)
}

// sheddingLimiter is the handler of a limiter observed by obs on a stub
// that answers until it is set to "notsent": then this process never
// sends a call, and sheds every request with 503.
func sheddingLimiter(t *testing.T, obs ceiling.Observer) (*stub, http.Handler) {
	busy := &stub{}
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "search", Key: ceiling.RemoteAddr, Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailOpen},
	}, ceiling.WithBackend(busy), ceiling.WithObserver(obs), ceiling.WithTimeout(100*time.Millisecond), quiet)
	t.Cleanup(func() { l.Close() })
	return busy, l.Handler(ok)
}

// memoryLimiters are the outage's limiters on in-process stores, observed
// by obs: one whose rules reject and spare each other (every decision
// outcome), and one on a small store for a flood of fresh keys.
func memoryLimiters(t *testing.T, obs ceiling.Observer) (local, flooded *ceiling.Limiter) {
	store := memory.New()
	t.Cleanup(func() { store.Close() })
	local = ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Hour},
		{Name: "day", Key: ceiling.RemoteAddr, Limit: 100, Period: 24 * time.Hour},
		{Name: "new", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Hour, Shadow: true},
	}, ceiling.WithBackend(store), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { local.Close() })

	// A store bounded to a key per shard, for a flood of fresh keys that
	// each spend a unit: evicting them gives quota back.
	small := memory.New(memory.WithMaxKeys(1), memory.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { small.Close() })
	flooded = ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:to", Key: ceiling.RemoteAddr, Limit: 3, Period: time.Hour},
	}, ceiling.WithBackend(small), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { flooded.Close() })
	return local, flooded
}

// flood sends 200 requests from fresh addresses, each spending a unit of
// a key the small store then evicts.
func flood(flooded *ceiling.Limiter) {
	for i := range 200 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = fmt.Sprintf("127.0.%d.%d:1234", i/200, 1+i%200)
		flooded.Handler(ok).ServeHTTP(httptest.NewRecorder(), r)
	}
}

// waitFor sends requests until the limiter's health is status: the
// breaker's cool-down is real time, however short.
func waitFor(t *testing.T, l *ceiling.Limiter, status string, request func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Health().Status != status {
		if time.Now().After(deadline) {
			t.Fatalf("the limiter is still %s, want %s", l.Health().Status, status)
		}
		request()
		time.Sleep(time.Millisecond)
	}
}

// missingNames parses a PromQL expression and returns the metrics it
// selects (by name or by a __name__ matcher) that exported lacks.
func missingNames(expr string, exported map[string]bool) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var missing []string
	selectors := 0
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		if !exported[name] {
			missing = append(missing, name)
		}
		return nil
	})
	if selectors == 0 {
		return nil, fmt.Errorf("%q selects no metric", expr)
	}
	return missing, nil
}

// checkNames fails the test for an expression that does not parse or
// names a metric the exporter does not export.
func checkNames(t *testing.T, where, expr string, exported map[string]bool) {
	t.Helper()
	missing, err := missingNames(expr, exported)
	if err != nil {
		t.Errorf("%s: %v", where, err)
	}
	for _, n := range missing {
		t.Errorf("%s names %s, which the exporter does not export (it exports %v)", where, n, slices.Sorted(maps.Keys(exported)))
	}
}

// A querier evaluates PromQL on a recording, as Prometheus would.
type querier struct {
	engine  *promql.Engine
	storage storage.Queryable
}

func newQuerier(t *testing.T, load string) *querier {
	t.Helper()
	return &querier{promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000), promqltest.LoadedStorage(t, load)}
}

// instant evaluates expr at the offset from the recording's start.
func (q *querier) instant(t *testing.T, expr string, at time.Duration) promql.Vector {
	t.Helper()
	qry, err := q.engine.NewInstantQuery(context.Background(), q.storage, nil, expr, time.Unix(0, 0).Add(at))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer qry.Close()
	res := qry.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return vec
}
