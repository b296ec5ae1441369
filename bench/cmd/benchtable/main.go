// Command benchtable turns the output of the bench module's benchmarks
// into the Markdown tables of BENCHMARKS.md, with the ratio of ceiling to
// the best peer in each column computed from the same run.
//
// It reads `go test -bench` output on standard input. When a benchmark ran
// several times (-count), the run with the lowest ns/op stands for it: on a
// shared machine the fastest run is the one least disturbed.
//
//	go test -run '^$' -bench . -count 3 | benchtable
//
// With -charts DIR it also writes SVG bar charts of the rows readers compare
// at a glance into DIR and embeds each above its table, referred to by
// -chart-path (default DIR) from wherever the Markdown is read:
//
//	benchtable -charts charts -chart-path bench/charts <results.txt
package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	chartDir := flag.String("charts", "", "write SVG bar charts into this `directory` and embed them above their tables")
	chartPath := flag.String("chart-path", "", "the charts' directory as the Markdown refers to it (default: -charts)")
	flag.Parse()
	results, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	var embeds map[string]string
	if *chartDir != "" {
		if embeds, err = writeCharts(*chartDir, cmp.Or(*chartPath, *chartDir), results); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
	}
	render(os.Stdout, results, embeds)
}

// writeCharts writes results' charts into dir and returns, by family, the
// Markdown that embeds each, its path under prefix.
func writeCharts(dir, prefix string, results []result) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("charts: %w", err)
	}
	embeds := map[string]string{}
	for _, c := range charts(results) {
		name := filepath.Join(dir, c.file)
		f, err := os.Create(name)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", name, err)
		}
		err = c.writeSVG(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", name, err)
		}
		embeds[c.family] = fmt.Sprintf("![%s](%s)", c.title, path.Join(prefix, c.file))
	}
	return embeds, nil
}

// A result is one benchmark line: BenchmarkFamily/variant.../lib-procs.
type result struct {
	family  string             // "Decide"
	variant string             // "keys=1/serial"; "" when the lib is the only level
	lib     string             // "ceiling"
	metrics map[string]float64 // unit → value: "ns/op", "allocs/op", "cmds/op"...
}

var line = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// parse reads benchmark lines, keeping for each benchmark the run with the
// lowest ns/op, in the order benchmarks first appear.
func parse(r io.Reader) ([]result, error) {
	var out []result
	index := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := line.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		parts := strings.Split(m[1], "/")
		if len(parts) < 2 {
			continue
		}
		res := result{
			family:  parts[0],
			variant: strings.Join(parts[1:len(parts)-1], "/"),
			lib:     parts[len(parts)-1],
			metrics: map[string]float64{},
		}
		fields := strings.Fields(m[2])
		if len(fields)%2 != 0 {
			return nil, fmt.Errorf("line %q: odd number of value/unit fields", sc.Text())
		}
		for i := 0; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", sc.Text(), err)
			}
			res.metrics[fields[i+1]] = v
		}
		if i, ok := index[m[1]]; ok {
			if res.metrics["ns/op"] < out[i].metrics["ns/op"] {
				out[i] = res
			}
			continue
		}
		index[m[1]] = len(out)
		out = append(out, res)
	}
	return out, sc.Err()
}

// A family says how one benchmark's results become a table.
type family struct {
	// name is the benchmark family the table reads; a name ending in CPU
	// is a second table of the family without it (RedisKeysCPU).
	name, title string
	// cell formats one result; base is the result of the row's base (the
	// framework without a limiter), or nil.
	cell func(r, base *result) string
	// ratio is the value compared between ceiling and the best peer (lower
	// is better), or nil for no ratio row.
	ratio func(r, base *result) (float64, bool)
	// unit names the ratio's quantity in its row.
	unit string
	// against lists the ratio rows: a ceiling row and the peers it is
	// compared with; nil compares every ceiling row with every peer.
	against []comparison
}

// A comparison is one ratio row: ceiling row lib against the best of the
// peers that peer accepts, described by label. With self, peer may accept
// another ceiling row (the public path against the store alone).
type comparison struct {
	lib, label string
	peer       func(lib string) bool
	self       bool
}

// sendsHeaders reports whether a middleware writes rate-limit headers:
// Echo's limiter and the hand-written x/time/rate one write none, so they
// do less work per request than ceiling's default.
func sendsHeaders(lib string) bool { return lib != "echo" && lib != "xtimerate" }

func anyPeer(string) bool { return true }

func isStore(lib string) bool { return lib == "ceiling-store" }

// publicAndStore compares each of ceiling's rows (the public path, under
// the default algorithm and GCRA, the decision calls without HTTP, the
// store alone) with the best peer, and the default's public path and
// decision calls with the store, so that what the limiter adds is a
// number.
var publicAndStore = []comparison{
	{"ceiling", "best peer", anyPeer, false},
	{"ceiling-gcra", "best peer", anyPeer, false},
	{"ceiling-decide", "best peer", anyPeer, false},
	{"ceiling-store", "best peer", anyPeer, false},
	{"ceiling", "ceiling-store", isStore, true},
	{"ceiling-decide", "ceiling-store", isStore, true},
}

var families = []family{
	{"Decide", "In-memory decision: ns/op (allocs/op)", nsAllocs, nsOp, "ns/op", publicAndStore},
	{"Middleware", "Whole middleware over a bare handler: overhead ns/op over its base (allocs/op); bases show their own ns/op", overhead, overheadNs, "overhead", []comparison{
		{"ceiling", "best peer that sends rate-limit headers", sendsHeaders, false},
		{"ceiling", "best peer", anyPeer, false},
		{"ceiling-noheaders", "best peer", anyPeer, false},
	}},
	{"Redis", "Redis decision on a local redis-server: serial µs/op and parallel64 decisions/s; commands sent, round trips and calls Redis ran (scripts' calls included) per decision; allocs/op", redisCell, nsOp, "ns/op", publicAndStore},
	{"RedisKeys", "Redis decision, one rule, on one hot key and over 100k keys: serial µs/op and parallel64 decisions/s; commands, round trips and Redis calls per decision; allocs/op. The -pinned columns ran with redis-server on one core and the benchmark (GOMAXPROCS=1) on the other", redisCell, nsOp, "ns/op", publicAndStore},
	{"RedisKeysCPU", "Client CPU per decision in the same runs (cpu-ns/op: the benchmark process's CPU, every thread and the GC, over the decisions; redis-server's is not in it)", cpuCell, cpuOp, "cpu-ns/op", publicAndStore},
	{"ScriptServerTime", "Redis server time of one decision's script: usec of the script commands per call (INFO commandstats) · the server's CPU per decision (INFO cpu)", scriptCell, nil, "", nil},
	{"Exact", "Exactness: limit 100/min, 1000 concurrent decisions on one key from 4 instances on one Redis (exactly 100 is correct)", exactCell, nil, "", nil},
	{"Boundary", "Window boundary: requests admitted in the 100 ms around a boundary, limit 50/s", boundaryCell, nil, "", nil},
	{"Keys1M", "Memory: heap per key with 1M distinct keys; left per key after every key went idle", keysCell, bytesPerKey, "bytes/key", nil},
	{"Attack", "Under attack: 10,000 requests from one already-rejected key", attackCell, cmdsPer10k, "Redis commands", nil},
}

func nsOp(r, _ *result) (float64, bool) { v, ok := r.metrics["ns/op"]; return v, ok }

func cpuOp(r, _ *result) (float64, bool) { v, ok := r.metrics["cpu-ns/op"]; return v, ok }

func cpuCell(r, _ *result) string { return fmt.Sprintf("%s µs", num(r.metrics["cpu-ns/op"]/1000)) }

func overheadNs(r, base *result) (float64, bool) {
	if base == nil {
		return 0, false
	}
	return r.metrics["ns/op"] - base.metrics["ns/op"], true
}

func bytesPerKey(r, _ *result) (float64, bool) { v, ok := r.metrics["bytes/key"]; return v, ok }

func cmdsPer10k(r, _ *result) (float64, bool) { v, ok := r.metrics["cmds/10k"]; return v, ok }

func nsAllocs(r, _ *result) string {
	cell := fmt.Sprintf("%s (%s)", num(r.metrics["ns/op"]), num(r.metrics["allocs/op"]))
	if e := r.metrics["errors/op"]; e > 0 {
		cell += fmt.Sprintf(", %.1e errors/op", e)
	}
	return cell
}

func overhead(r, base *result) string {
	if base == nil {
		return fmt.Sprintf("base: %s", num(r.metrics["ns/op"]))
	}
	v, _ := overheadNs(r, base)
	return fmt.Sprintf("%s (%s)", num(v), num(r.metrics["allocs/op"]))
}

func redisCell(r, _ *result) string {
	m := r.metrics
	speed := fmt.Sprintf("%s µs", num(m["ns/op"]/1000))
	if v, ok := m["decisions/s"]; ok {
		speed = fmt.Sprintf("%s/s", num(v))
	}
	cell := fmt.Sprintf("%s · %s cmd · %s rtt · %s srv · %s allocs", speed, num(m["cmds/op"]), num(m["trips/op"]), num(m["srvcalls/op"]), num(m["allocs/op"]))
	if e := m["errors/op"]; e > 0 {
		cell += fmt.Sprintf(" · %s errors/op", num(e))
	}
	return cell
}

func scriptCell(r, _ *result) string {
	return fmt.Sprintf("%s µs · %s µs CPU", num(r.metrics["srv-us/op"]), num(r.metrics["cpu-us/op"]))
}

func exactCell(r, _ *result) string {
	m := r.metrics
	mark := "✗"
	if m["admitted"] == 100 && m["errors"] == 0 {
		mark = "✓"
	}
	return fmt.Sprintf("%s %s admitted, %s rejected, %s errors (%s ms)", mark, num(m["admitted"]), num(m["rejected"]), num(m["errors"]), num(m["ms"]))
}

func boundaryCell(r, _ *result) string {
	return fmt.Sprintf("%s (%s× limit)", num(r.metrics["admitted"]), num(r.metrics["x-limit"]))
}

func keysCell(r, _ *result) string {
	return fmt.Sprintf("%s B/key held · %s B/key left idle", num(r.metrics["bytes/key"]), num(r.metrics["idle-bytes/key"]))
}

func attackCell(r, _ *result) string {
	m := r.metrics
	return fmt.Sprintf("%s cmds · %s srv calls · %s ns/request", num(m["cmds/10k"]), num(m["srvcalls/10k"]), num(m["ns/req"]))
}

// num prints v with three significant figures at most, without exponent.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1_000_000:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	case a >= 10_000:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case a >= 100 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// isBase reports whether lib is a framework without a limiter.
func isBase(lib string) bool { return lib == "bare" || strings.HasSuffix(lib, "-bare") }

// baseOf names the row lib's overhead is measured against.
func baseOf(lib string) string {
	if lib == "echo" {
		return "echo-bare"
	}
	return "bare"
}

func isCeiling(lib string) bool { return strings.HasPrefix(lib, "ceiling") }

// render writes one table per family present in results: a row per
// library, a column per variant, then for each ceiling row its ratio to
// the best peer of each column. A family's embed, if any, goes above its
// table.
func render(w io.Writer, results []result, embeds map[string]string) {
	for _, f := range families {
		variants, libs, cells := table(results, strings.TrimSuffix(f.name, "CPU"))
		if len(libs) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### %s\n\n", f.title)
		if e := embeds[f.name]; e != "" {
			fmt.Fprintf(w, "%s\n\n", e)
		}
		header := []string{"library"}
		for _, v := range variants {
			if v == "" {
				v = "result"
			}
			header = append(header, v)
		}
		row(w, header)
		row(w, repeat("---", len(header)))
		baseFor := func(v, lib string) *result {
			if f.name != "Middleware" || isBase(lib) {
				return nil
			}
			return cells[[2]string{v, baseOf(lib)}]
		}
		for _, lib := range libs {
			cols := []string{lib}
			for _, v := range variants {
				r := cells[[2]string{v, lib}]
				if r == nil {
					cols = append(cols, "")
					continue
				}
				cols = append(cols, f.cell(r, baseFor(v, lib)))
			}
			row(w, cols)
		}
		if f.ratio == nil {
			continue
		}
		against := f.against
		if against == nil {
			for _, c := range libs {
				if isCeiling(c) {
					against = append(against, comparison{c, "best peer", anyPeer, false})
				}
			}
		}
		for _, cmp := range against {
			if !contains(libs, cmp.lib) {
				continue
			}
			cols := []string{fmt.Sprintf("**%s ÷ %s** (%s)", cmp.lib, cmp.label, f.unit)}
			for _, v := range variants {
				cols = append(cols, ratioCell(f, cells, v, cmp, libs, baseFor))
			}
			row(w, cols)
		}
	}
}

// ratioCell compares a ceiling row with the best of its peers in variant v.
func ratioCell(f family, cells map[[2]string]*result, v string, cmp comparison, libs []string, baseFor func(v, lib string) *result) string {
	c := cmp.lib
	r := cells[[2]string{v, c}]
	if r == nil {
		return ""
	}
	mine, ok := f.ratio(r, baseFor(v, c))
	if !ok {
		return ""
	}
	best, bestLib := math.Inf(1), ""
	for _, lib := range libs {
		p := cells[[2]string{v, lib}]
		if p == nil || lib == c || isCeiling(lib) && !cmp.self || isBase(lib) || !cmp.peer(lib) {
			continue
		}
		if x, ok := f.ratio(p, baseFor(v, lib)); ok && x < best {
			best, bestLib = x, lib
		}
	}
	switch {
	case bestLib == "":
		return ""
	case best <= 0 || mine <= 0: // a ratio of zeros (or of noise below a base) says nothing
		return fmt.Sprintf("%s vs %s (%s)", num(mine), num(best), bestLib)
	}
	return fmt.Sprintf("**%s×** (%s)", num(mine/best), bestLib)
}

func row(w io.Writer, cols []string) { fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | ")) }

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
