package ceilingotel_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// row is one line of the README's instrument table.
type row struct{ name, kind, unit, attrs, prom string }

func readmeRows(t *testing.T) []row {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, found := strings.Cut(string(b), "| instrument | kind | unit | attributes | Prometheus name |")
	if !found {
		t.Fatal("README.md has no instrument table")
	}
	var rows []row
	for _, line := range strings.Split(table, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		c := strings.Split(line, "|")
		cell := func(i int) string { return strings.Trim(strings.TrimSpace(c[i]), "`") }
		attrs := strings.ReplaceAll(strings.ReplaceAll(strings.TrimSpace(c[4]), "`", ""), " ", "")
		rows = append(rows, row{cell(1), cell(2), cell(3), attrs, cell(5)})
	}
	return rows
}

// The README's instrument table is what the observer exports: each
// instrument's name, kind, unit and attributes. Nothing is missing from
// the table, nor in it and not exported. (Its Prometheus names are
// checked in metrics/prometheus/check, on the exporter's scrape: the
// Prometheus client is no requirement of this module.)
func TestREADMETableIsWhatIsExported(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp, Attributes: []attribute.KeyValue{attribute.String("limiter", "api")}})
	if err != nil {
		t.Fatal(err)
	}
	obs.ObserveConfig([]string{"chat"}, 100*time.Millisecond, func() ceiling.Health {
		return ceiling.Health{EvictedKeys: 2, Rules: []ceiling.RuleHealth{{Name: "chat", SlotsInUse: 1}}}
	})
	obs.ObserveDecision("chat", ceiling.OutcomeRejected)
	obs.ObserveBackend(time.Millisecond, errors.New("dial tcp 127.0.0.1:1: connection refused"))
	obs.ObserveCached()
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true})
	obs.ObserveFailMode("chat", ceiling.FailOpen)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]row{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ceilingotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, ceilingotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			r := row{name: m.Name, unit: m.Unit}
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				r.kind = "counter"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				r.kind = "histogram"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				r.kind = "gauge"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Gauge[float64]:
				r.kind = "gauge"
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
			keys := map[string]bool{}
			for _, s := range sets {
				for _, kv := range s.ToSlice() {
					if kv.Key != "limiter" {
						keys[string(kv.Key)] = true
					}
				}
			}
			r.attrs = strings.Join(slices.Sorted(maps.Keys(keys)), ",")
			got[m.Name] = r
		}
	}
	rows := readmeRows(t)
	for _, want := range rows {
		g, ok := got[want.name]
		if !ok {
			t.Errorf("README lists %s, which is not exported", want.name)
			continue
		}
		sorted := strings.Join(slices.Sorted(slices.Values(strings.Split(want.attrs, ","))), ",")
		if g.kind != want.kind || g.unit != want.unit || g.attrs != strings.Trim(sorted, ",") {
			t.Errorf("%s is exported as %s %q with attributes %q; README says %s %q with %q", want.name, g.kind, g.unit, g.attrs, want.kind, want.unit, want.attrs)
		}
		delete(got, want.name)
	}
	for name := range got {
		t.Errorf("%s is exported but not in README's table", name)
	}
}
