package check_test

import (
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
)

func loadAlerts(t *testing.T) map[string]rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile("../alerts.yml", false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	alerts := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("rule %q is not an alert", r.Record)
				continue
			}
			alerts[r.Alert] = r
		}
	}
	return alerts
}

// The shipped rule file loads in Prometheus (rulefmt validates the YAML,
// the expressions and the annotation templates), every metric it names is
// one the exporter exports after deciding, failing and degrading, and
// every alert says what is wrong and where its runbook is: renaming a
// metric without updating the rules fails here, not silently in
// production.
func TestAlertRulesLoadAndNameExportedMetrics(t *testing.T) {
	alerts := loadAlerts(t)
	checkAlertNames(t, alerts, outage(t).names())
	anchors := readmeAnchors(t)
	for name, r := range alerts {
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s has no %s", name, a)
			}
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s has no severity", name)
		}
		_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "/metrics/prometheus/README.md#")
		if !anchors[anchor] {
			t.Errorf("%s's runbook_url %q has no section in README.md", name, r.Annotations["runbook_url"])
		}
	}
	if r := alerts["CeilingMetricsAbsent"]; !strings.HasPrefix(strings.TrimSpace(r.Expr), "absent(") {
		t.Errorf("CeilingMetricsAbsent is not an absent(): %q", r.Expr)
	}
	// Degraded for a moment is the breaker doing its job; past a minute or
	// so somebody must know.
	if d := time.Duration(alerts["CeilingDegraded"].For); d <= 0 || d > 5*time.Minute {
		t.Errorf("CeilingDegraded waits %v, want a short for:", d)
	}
}

// checkAlertNames fails the test for an alert whose expression does not
// parse or names a metric that exported lacks.
func checkAlertNames(t *testing.T, alerts map[string]rulefmt.Rule, exported map[string]bool) {
	t.Helper()
	for name, r := range alerts {
		checkNames(t, name, r.Expr, exported)
	}
}

// firing evaluates every alert on a recording at the offset from its
// start, as a rule evaluation would, and returns each firing alert's
// series, described.
func firing(t *testing.T, alerts map[string]rulefmt.Rule, load string, at time.Duration) map[string][]string {
	t.Helper()
	q := newQuerier(t, load)
	out := map[string][]string{}
	for name, r := range alerts {
		for _, s := range q.instant(t, r.Expr, at) {
			out[name] = append(out[name], describe(s))
		}
		slices.Sort(out[name])
	}
	return out
}

// Each alert fires on what the exporter really reported through an
// outage, naming the process, the limiter and the rule, and none fires on
// a healthy limiter: an expression whose labels never match, or that
// watches a series born already incremented, would load and never fire.
func TestAlertsFireOnAnOutageAndNotWhenHealthy(t *testing.T) {
	alerts := loadAlerts(t)
	eval := func(t *testing.T, load string, at time.Duration) map[string][]string {
		t.Helper()
		return firing(t, alerts, load, at)
	}

	t.Run("outage", func(t *testing.T) {
		rec := outage(t)
		const who = `instance=app-1:8080 job=api limiter=api`
		want := map[string][]string{
			"CeilingDegraded":                  {who},
			"CeilingDegradedFlapping":          {who},
			"CeilingFailOpenAdmissions":        {`ceiling_rate_limiting_fail_mode=open ceiling_rate_limiting_rule=chat ` + who},
			"CeilingFailLocalAdmissions":       {`ceiling_rate_limiting_fail_mode=local ceiling_rate_limiting_rule=shop ` + who},
			"CeilingBackendErrors":             {who},
			"CeilingBackendLatencyNearTimeout": {who},
			"CeilingEvictionsGiveBackQuota":    {who},
			"CeilingFailClosedRefusals":        {`ceiling_rate_limiting_rule=pay ` + who},
			"CeilingShedding":                  {who},
		}
		// At 6m, the scrape that first shows the outage (the fail-mode
		// counters' first increase), and a minute later.
		for _, at := range []time.Duration{6 * time.Minute, 7 * time.Minute} {
			compareFiring(t, eval(t, rec.load(), at), want, rec)
		}
	})
	t.Run("healthy", func(t *testing.T) {
		rec := healthy(t)
		compareFiring(t, eval(t, rec.load(), 6*time.Minute), map[string][]string{}, rec)
	})
	t.Run("no limiter scraped", func(t *testing.T) {
		got := eval(t, "load 1m\n  up{instance=\"app-1:8080\",job=\"api\"} 1 1 1 1 1 1 1 1 1 1 1\n", 10*time.Minute)
		compareFiring(t, got, map[string][]string{"CeilingMetricsAbsent": {""}}, nil)
	})
}

// describe is a sample's labels, sorted, without the metric name.
func describe(s promql.Sample) string {
	var parts []string
	s.Metric.Range(func(l labels.Label) {
		if l.Name != "__name__" {
			parts = append(parts, l.Name+"="+l.Value)
		}
	})
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

func compareFiring(t *testing.T, got, want map[string][]string, rec *recording) {
	t.Helper()
	bad := false
	for name := range loadAlertsNames(got, want) {
		if !slices.Equal(got[name], want[name]) {
			t.Errorf("%s fires for %q, want %q", name, got[name], want[name])
			bad = true
		}
	}
	if bad && rec != nil {
		t.Logf("what was scraped:\n%s", rec.load())
	}
}

func loadAlertsNames(a, b map[string][]string) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// The name check catches a misspelt metric and an expression that does
// not parse, so the shipped files pass it for a reason.
func TestNameCheckCatchesRenamedMetrics(t *testing.T) {
	exported := map[string]bool{"ceiling_rate_limiting_degraded": true, "ceiling_rate_limiting_backend_duration_seconds_bucket": true}
	missing, err := missingNames(`increase(ceiling_rate_limiting_failmode_admissions_total{ceiling_rate_limiting_fail_mode="open"}[5m]) > 0 or {__name__="ceiling_rate_limiting_degraded_total"} or ceiling_rate_limiting_degraded`, exported)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ceiling_rate_limiting_failmode_admissions_total", "ceiling_rate_limiting_degraded_total"}; !slices.Equal(missing, want) {
		t.Errorf("missing = %v, want %v", missing, want)
	}
	if _, err := missingNames(`rate(ceiling_rate_limiting_degraded[5m]`, exported); err == nil {
		t.Error("an unbalanced expression parsed")
	}
	if _, err := missingNames(`vector(1)`, exported); err == nil {
		t.Error("an expression that selects no metric passed")
	}
}

var heading = regexp.MustCompile(`(?m)^#+ (.+)$`)

// readmeAnchors returns the anchors GitHub gives README.md's headings.
func readmeAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
		a := strings.Map(func(r rune) rune {
			switch {
			case r == ' ' || r == '-':
				return '-'
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
				return r
			case r >= 'A' && r <= 'Z':
				return r + 'a' - 'A'
			}
			return -1
		}, m[1])
		out[a] = true
	}
	return out
}
