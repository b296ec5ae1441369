package check_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	redisbackend "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// otelObserved is a ceilingotel observer on an OpenTelemetry SDK whose
// reader is the OpenTelemetry Prometheus exporter, with its defaults, into
// a registry of its own, and a recording of that registry.
func otelObserved(t *testing.T) (*ceilingotel.Observer, *recording) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp, Attributes: []attribute.KeyValue{attribute.String("limiter", "api")}})
	if err != nil {
		t.Fatal(err)
	}
	return obs, recordingOf(t, reg)
}

// otelOutage records, through the OpenTelemetry exporter, what outage does
// with a stub, on a real Redis server: healthy for five minutes, then
// frozen for ten calls (each times out, each followed by one it answers,
// so the breaker stays closed), then killed until the limiter is
// degraded, restarted until it is healthy, three times, and left down
// while the fail modes admit and a rule failing closed refuses; meanwhile
// the memory limiters decide every outcome, a flood of fresh keys meets
// the small store, and a busy limiter sheds.
func otelOutage(t *testing.T) *recording {
	obs, rec := otelObserved(t)
	local, flooded := memoryLimiters(t, obs)
	busy, shedding := sheddingLimiter(t, obs)

	srv := redistest.Server(t)
	store := redisbackend.New(srv.Client(t), redisbackend.WithPrefix(redistest.KeyPrefix(t)))
	const timeout = 100 * time.Millisecond
	remote := ceiling.MustNew([]ceiling.Rule{
		{Name: "chat", Key: ceiling.RemoteAddr, Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailOpen},
		{Name: "shop", Key: ceiling.Static("s"), Limit: 1_000_000, Period: time.Minute, FailMode: ceiling.FailLocal},
	}, ceiling.WithBackend(store), ceiling.WithObserver(obs), ceiling.WithTimeout(timeout),
		ceiling.WithBreaker(ceiling.BreakerConfig{Failures: 3, CoolDown: 10 * time.Millisecond, MaxCoolDown: 10 * time.Millisecond}), quiet)
	t.Cleanup(func() { remote.Close() })
	h := remote.Handler(ok)
	closed := failingClosed(t, store, obs)

	rec.scrape()
	for range 5 { // 0m–5m: healthy
		get(local.Handler(ok), 3)
		get(h, 5)
		get(closed, 5)
		get(shedding, 5)
		rec.scrape()
	}
	for range 10 {
		srv.Freeze(t)
		get(h, 1)
		srv.Thaw(t)
		waitFor(t, remote, "healthy", func() { get(h, 1) })
		get(h, 1)
	}
	for i := range 3 {
		srv.Kill()
		waitFor(t, remote, "degraded", func() { get(h, 1) })
		if i < 2 {
			srv.Restart(t)
			waitFor(t, remote, "healthy", func() { get(h, 1) })
		}
	}
	busy.set("notsent")
	get(h, 5)
	get(closed, 5)
	get(shedding, 100)
	flood(flooded)
	rec.scrape() // 6m
	get(h, 5)
	get(closed, 5)
	get(shedding, 100)
	rec.scrape() // 7m: still degraded
	return rec
}

// withScope adds to a firing alert's description the labels the
// OpenTelemetry exporter puts on every series: the instrumentation scope.
func withScope(desc string) string {
	parts := append(strings.Fields(desc), "otel_scope_name="+ceilingotel.ScopeName)
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// The alert rules that ship with ceilingprom fire on what the
// OpenTelemetry Prometheus exporter reported through a real Redis outage,
// the same alerts for the same series as ceilingprom's own, and none fires
// on a healthy limiter: either exporter drives the alerts.
func TestAlertsFireOnTheOTelExportOfARedisOutage(t *testing.T) {
	alerts := loadAlerts(t)
	t.Run("outage", func(t *testing.T) {
		rec := otelOutage(t)
		checkAlertNames(t, alerts, rec.names())
		who := withScope(`instance=app-1:8080 job=api limiter=api`)
		want := map[string][]string{
			"CeilingDegraded":                  {who},
			"CeilingDegradedFlapping":          {who},
			"CeilingFailOpenAdmissions":        {withScope(`instance=app-1:8080 job=api limiter=api ceiling_rate_limiting_fail_mode=open ceiling_rate_limiting_rule=chat`)},
			"CeilingFailLocalAdmissions":       {withScope(`instance=app-1:8080 job=api limiter=api ceiling_rate_limiting_fail_mode=local ceiling_rate_limiting_rule=shop`)},
			"CeilingBackendErrors":             {who},
			"CeilingBackendLatencyNearTimeout": {who},
			"CeilingEvictionsGiveBackQuota":    {who},
			"CeilingFailClosedRefusals":        {withScope(`instance=app-1:8080 job=api limiter=api ceiling_rate_limiting_rule=pay`)},
			"CeilingShedding":                  {who},
		}
		for _, at := range []time.Duration{6 * time.Minute, 7 * time.Minute} {
			compareFiring(t, firing(t, alerts, rec.load(), at), want, rec)
		}
	})
	t.Run("healthy", func(t *testing.T) {
		obs, rec := otelObserved(t)
		recordHealthy(t, obs, rec)
		compareFiring(t, firing(t, alerts, rec.load(), 6*time.Minute), map[string][]string{}, rec)
	})
}

// Every panel of the shipped dashboard parses, names only series the
// OpenTelemetry exporter exports, and shows something for the real Redis
// outage it reported.
func TestDashboardShowsTheOTelExportOfARedisOutage(t *testing.T) {
	checkDashboard(t, otelOutage(t))
}

// The Prometheus names that metrics/otel's README gives its instruments
// are the names, and the attributes the labels, that the OpenTelemetry
// exporter exports.
func TestOTelREADMENamesWhatTheExporterExports(t *testing.T) {
	b, err := os.ReadFile("../../otel/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, found := strings.Cut(string(b), "| instrument | kind | unit | attributes | Prometheus name |")
	if !found {
		t.Fatal("metrics/otel/README.md has no instrument table")
	}
	obs, rec := otelObserved(t)
	local, flooded := memoryLimiters(t, obs)
	get(local.Handler(ok), 3)
	flood(flooded)
	obs.ObserveConfig(nil, time.Second, nil)
	obs.ObserveBackend(time.Millisecond, ceiling.ErrTimeout)
	rec.scrape()
	labels := map[string]string{} // series name → its labels but the scrape's and the scope's
	for s := range rec.series {
		name, rest, _ := strings.Cut(strings.TrimSuffix(s, "}"), "{")
		var keys []string
		for _, kv := range strings.Split(rest, ",") {
			k, _, _ := strings.Cut(kv, "=")
			switch k {
			case "instance", "job", "limiter", "le", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url", "":
			default:
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		labels[name] = strings.Join(keys, ",")
	}
	rows := 0
	for _, line := range strings.Split(table, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		rows++
		c := strings.Split(line, "|")
		instrument, kind := strings.Trim(strings.TrimSpace(c[1]), "`"), strings.TrimSpace(c[2])
		// The exporter names an attribute's label by replacing what a
		// label name may not hold, the dots, with underscores.
		attrs := strings.Split(strings.NewReplacer("`", "", " ", "", ".", "_").Replace(c[4]), ",")
		slices.Sort(attrs)
		prom := strings.Trim(strings.TrimSpace(c[5]), "`")
		series := prom
		if kind == "histogram" {
			series += "_count"
		}
		got, ok := labels[series]
		if want := strings.Trim(strings.Join(attrs, ","), ","); !ok || got != want {
			t.Errorf("%s: the exporter gives no %s with labels %q (got %q, present %v)", instrument, series, want, got, ok)
		}
	}
	if rows == 0 {
		t.Error("the instrument table has no rows")
	}
}
