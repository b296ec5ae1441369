package check_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// dashboard is the part of Grafana's dashboard model the checks read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int                 `json:"id"`
	Type        string              `json:"type"`
	Title       string              `json:"title"`
	Description string              `json:"description"`
	Datasource  *datasource         `json:"datasource"`
	GridPos     *struct{ W, H int } `json:"gridPos"`
	Targets     []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// grafanaVars are the variables Grafana replaces in a query before
// Prometheus sees it, with a value of the right shape.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h",
	"$job", ".*", "$instance", ".*", "$rule", ".*",
)

var labelValues = regexp.MustCompile(`^label_values\((.+), *\w+\)$`)

// The shipped dashboard is a Grafana dashboard whose every query parses as
// PromQL once Grafana's variables are replaced and names only metrics the
// exporter exports, with a panel for each thing an operator asks of a
// limiter.
func TestDashboardQueriesParseAndNameExportedMetrics(t *testing.T) {
	checkDashboard(t, outage(t))
}

// checkDashboard checks the shipped dashboard against rec, a recording of
// an outage that reaches 7m.
func checkDashboard(t *testing.T, rec *recording) {
	t.Helper()
	b, err := os.ReadFile("../dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("dashboard lacks uid, title or schemaVersion: %q %q %d", d.UID, d.Title, d.SchemaVersion)
	}
	exported := rec.names()
	q := newQuerier(t, rec.load())

	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		// Grafana takes the query as a string, or as an object holding it.
		q, ok := v.Query.(string)
		if obj, isObj := v.Query.(map[string]any); isObj {
			q, ok = obj["query"].(string)
		}
		if !ok {
			t.Errorf("variable %s: query %v is not a string", v.Name, v.Query)
			continue
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q))
		if m == nil {
			t.Errorf("variable %s: query %v is not label_values(selector, label)", v.Name, v.Query)
			continue
		}
		checkNames(t, "variable "+v.Name, grafanaVars.Replace(m[1]), exported)
	}
	for _, name := range []string{"datasource", "job", "instance", "rule"} {
		if !vars[name] {
			t.Errorf("no $%s variable", name)
		}
	}

	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids := map[int]bool{}
	var exprs []string
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q has no size", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Description == "" {
			t.Errorf("panel %q has no description", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not query the $datasource variable: %+v", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			where := p.Title + " " + tg.RefID
			expr := grafanaVars.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("%s: unknown variable in %q", where, tg.Expr)
				continue
			}
			checkNames(t, where, expr, exported)
			exprs = append(exprs, tg.Expr)
			// Through an outage every panel has something to show.
			if len(q.instant(t, expr, 7*time.Minute)) == 0 {
				t.Errorf("%s shows nothing for what the exporter reported through an outage: %s", where, tg.Expr)
			}
		}
	}
	// What the issue asks the dashboard to show, by what it queries.
	joined := strings.Join(exprs, "\n")
	for what, want := range map[string]*regexp.Regexp{
		"decisions per rule by result": regexp.MustCompile(`sum by \(ceiling_rate_limiting_rule, ceiling_rate_limiting_result\) \(rate\(ceiling_rate_limiting_requests_total`),
		"rejection ratio":              regexp.MustCompile(`(?s)ceiling_rate_limiting_requests_total\{ceiling_rate_limiting_result="rejected".*\n *\/ sum by \(ceiling_rate_limiting_rule\) \(rate\(ceiling_rate_limiting_requests_total`),
		"backend latency quantiles":    regexp.MustCompile(`histogram_quantile\(0\.99, sum by \(le\) \(rate\(ceiling_rate_limiting_backend_duration_seconds_bucket`),
		"degraded state":               regexp.MustCompile(`ceiling_rate_limiting_degraded\{`),
		"fail-mode admissions":         regexp.MustCompile(`ceiling_rate_limiting_fail_mode_admissions_total`),
		"deny-cache hits":              regexp.MustCompile(`ceiling_rate_limiting_deny_cache_hits_total`),
	} {
		if !want.MatchString(joined) {
			t.Errorf("no panel shows %s (%s)", what, want)
		}
	}
}
