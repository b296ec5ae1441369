// Command benchrounds says how stable each column of bench/run.sh's timed
// tables is: run.sh times the whole suite in rounds, and benchtable keeps
// each benchmark's fastest round; this reads the same output and prints,
// for every column, how far ceiling's own time and the best peer's moved
// between rounds (slowest ÷ fastest), and the ratio of the two in each
// round, so that a reader can tell a ratio from the noise around it.
//
//	benchrounds <results.txt
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	rounds, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchrounds:", err)
		os.Exit(1)
	}
	render(os.Stdout, rounds)
}

// timed are the families run.sh times in rounds, in the order of its
// tables.
var timed = []string{"Decide", "Middleware", "Redis", "RedisKeys"}

// A sample is one benchmark's ns/op in one round.
type sample struct {
	family, variant, lib string
	round                int
	ns                   float64
}

var (
	line      = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)
	roundMark = regexp.MustCompile(`^round (\d+) of \d+$`)
)

// parse reads run.sh's output: "round k of n" lines, each followed by its
// benchmark lines, then "experiments" and the runs made once.
func parse(r io.Reader) ([]sample, error) {
	var out []sample
	round := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		text := strings.TrimSpace(sc.Text())
		if m := roundMark.FindStringSubmatch(text); m != nil {
			round, _ = strconv.Atoi(m[1])
			continue
		}
		if text == "experiments" || text == "pinned" { // run.sh's one-off runs follow the rounds
			round = 0
			continue
		}
		m := line.FindStringSubmatch(text)
		if m == nil || round == 0 {
			continue
		}
		parts := strings.Split(m[1], "/")
		if len(parts) < 3 {
			continue
		}
		fields := strings.Fields(m[2])
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] != "ns/op" {
				continue
			}
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", text, err)
			}
			out = append(out, sample{parts[0], strings.Join(parts[1:len(parts)-1], "/"), parts[len(parts)-1], round, v})
		}
	}
	return out, sc.Err()
}

// isPeer reports whether lib is another library, not ceiling nor a bare
// framework.
func isPeer(lib string) bool {
	return !strings.HasPrefix(lib, "ceiling") && lib != "bare" && !strings.HasSuffix(lib, "-bare")
}

// base is the framework row a middleware's overhead is taken over.
func base(lib string) string {
	if lib == "echo" {
		return "echo-bare"
	}
	return "bare"
}

// render prints one Markdown table: a row per family and column.
func render(w io.Writer, samples []sample) {
	fmt.Fprintln(w, "| table | column | ceiling, slowest ÷ fastest round | best peer, slowest ÷ fastest round | ceiling ÷ best peer, each round |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
	for _, fam := range timed {
		var variants []string
		// value[variant][lib][round]: ns/op, or a middleware's overhead.
		value := map[string]map[string]map[int]float64{}
		rounds := 0
		for _, s := range samples {
			if s.family != fam {
				continue
			}
			if value[s.variant] == nil {
				variants = append(variants, s.variant)
				value[s.variant] = map[string]map[int]float64{}
			}
			if value[s.variant][s.lib] == nil {
				value[s.variant][s.lib] = map[int]float64{}
			}
			value[s.variant][s.lib][s.round] = s.ns
			rounds = max(rounds, s.round)
		}
		for _, v := range variants {
			libs := value[v]
			at := func(lib string, k int) (float64, bool) {
				x, ok := libs[lib][k]
				if !ok || fam != "Middleware" {
					return x, ok
				}
				b, ok := libs[base(lib)][k]
				return x - b, ok
			}
			// The best peer is the one fastest in its own best round, as in
			// benchtable's tables.
			best, bestV := "", math.Inf(1)
			for lib := range libs {
				if !isPeer(lib) {
					continue
				}
				for k := 1; k <= rounds; k++ {
					if x, ok := at(lib, k); ok && x < bestV {
						best, bestV = lib, x
					}
				}
			}
			if best == "" || libs["ceiling"] == nil {
				continue
			}
			var ratios []string
			for k := 1; k <= rounds; k++ {
				c, ok1 := at("ceiling", k)
				p, ok2 := at(best, k)
				if ok1 && ok2 && p > 0 {
					ratios = append(ratios, fmt.Sprintf("%.2f", c/p))
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s (%s) | %s |\n", fam, v, spread(at, "ceiling", rounds), spread(at, best, rounds), best, strings.Join(ratios, ", "))
		}
	}
}

// spread is lib's slowest round over its fastest.
func spread(at func(string, int) (float64, bool), lib string, rounds int) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for k := 1; k <= rounds; k++ {
		if x, ok := at(lib, k); ok {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if lo <= 0 || math.IsInf(lo, 1) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", hi/lo)
}
