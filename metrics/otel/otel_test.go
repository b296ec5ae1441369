package ceilingotel_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// sdkObserver is an observer on the SDK with a manual reader, and a
// function that collects each series' value by instrument and attributes
// ("ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=open,ceiling.rate_limiting.rule=chat}").
func sdkObserver(t *testing.T) (*ceilingotel.Observer, func() map[string]float64) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	return obs, func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		key := func(name string, s attribute.Set) string {
			k := name + "{"
			for i, kv := range s.ToSlice() {
				if i > 0 {
					k += ","
				}
				k += string(kv.Key) + "=" + kv.Value.Emit()
			}
			return k + "}"
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = float64(p.Value)
					}
				case metricdata.Gauge[int64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = float64(p.Value)
					}
				case metricdata.Gauge[float64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = p.Value
					}
				case metricdata.Histogram[float64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = float64(p.Count)
					}
				}
			}
		}
		return out
	}
}

func expect(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (exported %v), want %v", k, g, ok, v)
		}
	}
}

// The series alerts watch exist at zero before anything happened, so
// that their first increase is one increase() sees; the degraded gauge is
// 0 from the start (an absent one would look like no limiter at all), and
// the timeout is absent until a remote limiter gives one.
func TestAlertedSeriesStartAtZero(t *testing.T) {
	obs, collect := sdkObserver(t)
	got := collect()
	expect(t, got, map[string]float64{
		"ceiling.rate_limiting.degraded{}":                               0,
		"ceiling.rate_limiting.degraded.transitions{}":                   0,
		"ceiling.rate_limiting.deny_cache.hits{}":                        0,
		"ceiling.rate_limiting.evicted_keys{}":                           0,
		"ceiling.rate_limiting.backend.errors{error.type=timeout}":       0,
		"ceiling.rate_limiting.backend.errors{error.type=overloaded}":    0,
		"ceiling.rate_limiting.backend.errors{error.type=out of memory}": 0,
	})
	if _, ok := got["ceiling.rate_limiting.backend.timeout{}"]; ok {
		t.Error("a timeout is exported before any limiter gave one")
	}
	l := ceiling.MustNew([]ceiling.Rule{{Name: "chat", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}}, ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	expect(t, collect(), map[string]float64{
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=open,ceiling.rate_limiting.rule=chat}":  0,
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=local,ceiling.rate_limiting.rule=chat}": 0,
	})
}

// One observer shared by limiters: counts add up, the timeout is the
// smallest remote one, evictions and a rule's slots in use are the
// limiters' sums, and the degraded gauge follows the transitions.
func TestSharedObserverAddsUp(t *testing.T) {
	obs, collect := sdkObserver(t)
	obs.ObserveConfig([]string{"a"}, 200*time.Millisecond, func() ceiling.Health {
		return ceiling.Health{EvictedKeys: 2, Rules: []ceiling.RuleHealth{{Name: "a", SlotsInUse: 4}}}
	})
	obs.ObserveConfig([]string{"a", "b"}, 50*time.Millisecond, func() ceiling.Health {
		return ceiling.Health{EvictedKeys: 3, Rules: []ceiling.RuleHealth{{Name: "a", SlotsInUse: 1}, {Name: "b"}}}
	})
	obs.ObserveConfig([]string{"c"}, 0, nil) // in process: never timed out
	for range 3 {
		obs.ObserveDecision("a", ceiling.OutcomeAllowed)
	}
	obs.ObserveDecision("b", ceiling.OutcomeNotCharged)
	obs.ObserveDecision("unconfigured", ceiling.OutcomeShadowRejected)
	obs.ObserveFailMode("a", ceiling.FailLocal)
	obs.ObserveBackend(time.Millisecond, nil)
	obs.ObserveBackend(time.Second, ceiling.ErrTimeout)
	obs.ObserveBackend(time.Millisecond, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	obs.ObserveCached()
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true})
	expect(t, collect(), map[string]float64{
		"ceiling.rate_limiting.requests{ceiling.rate_limiting.result=allowed,ceiling.rate_limiting.rule=a}":                    3,
		"ceiling.rate_limiting.requests{ceiling.rate_limiting.result=not_charged,ceiling.rate_limiting.rule=b}":                1,
		"ceiling.rate_limiting.requests{ceiling.rate_limiting.result=shadow_rejected,ceiling.rate_limiting.rule=unconfigured}": 1,
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=local,ceiling.rate_limiting.rule=a}":       1,
		"ceiling.rate_limiting.fail_mode.admissions{ceiling.rate_limiting.fail_mode=open,ceiling.rate_limiting.rule=b}":        0,
		"ceiling.rate_limiting.backend.duration{}":                                     3,
		"ceiling.rate_limiting.backend.errors{error.type=timeout}":                     1,
		"ceiling.rate_limiting.backend.errors{error.type=unreachable}":                 1,
		"ceiling.rate_limiting.backend.timeout{}":                                      0.05,
		"ceiling.rate_limiting.evicted_keys{}":                                         5,
		"ceiling.rate_limiting.concurrency.slots_in_use{ceiling.rate_limiting.rule=a}": 5,
		"ceiling.rate_limiting.concurrency.slots_in_use{ceiling.rate_limiting.rule=b}": 0,
		"ceiling.rate_limiting.deny_cache.hits{}":                                      1,
		"ceiling.rate_limiting.degraded{}":                                             1,
		"ceiling.rate_limiting.degraded.transitions{}":                                 1,
	})
	obs.ObserveDegraded(ceiling.DegradedEvent{})
	expect(t, collect(), map[string]float64{"ceiling.rate_limiting.degraded{}": 0, "ceiling.rate_limiting.degraded.transitions{}": 1})
}

// A decision, a fail-mode admission and an answered backend call of a
// configured rule allocate nothing on the SDK's instruments. (A failed
// call pays what ceiling.KindOf allocates to tell its kind.)
func TestMeasurementsDoNotAllocate(t *testing.T) {
	obs, _ := sdkObserver(t)
	obs.ObserveConfig([]string{"chat"}, time.Second, nil)
	if n := testing.AllocsPerRun(100, func() {
		obs.ObserveDecision("chat", ceiling.OutcomeRejected)
		obs.ObserveFailMode("chat", ceiling.FailOpen)
		obs.ObserveBackend(time.Millisecond, nil)
	}); n != 0 {
		t.Errorf("%v allocations per measurement, want 0", n)
	}
}
