package main

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// chartSample adds to sample the families the other charts draw.
const chartSample = sample + `
BenchmarkMiddleware/clients=100k/parallel/bare-2    	 1000000	       5.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkMiddleware/clients=100k/parallel/ceiling-2 	 1000000	      205 ns/op	      80 B/op	       3 allocs/op
BenchmarkMiddleware/clients=100k/parallel/ulule-2   	 1000000	        2.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkRedis/rules=1/serial/ceiling-2      	   10000	     89000 ns/op	         1.000 cmds/op
BenchmarkRedis/rules=1/parallel64/ceiling-2  	   10000	     13986 ns/op	     71500 decisions/s	         1.000 cmds/op
BenchmarkRedis/rules=1/parallel64/ulule-2    	   10000	      7430 ns/op	    134600 decisions/s	         1.000 cmds/op
BenchmarkRedis/rules=3/parallel64/ceiling-2  	   10000	     33112 ns/op	     30200 decisions/s	         1.000 cmds/op
BenchmarkRedis/rules=3/parallel64/ulule-2    	   10000	     31152 ns/op	     32100 decisions/s	         3.000 cmds/op
BenchmarkKeys1M/ceiling-2  	       1	 1000000000 ns/op	        50.4 bytes/key	         0.50 idle-bytes/key
BenchmarkKeys1M/httprate-2 	       1	 1000000000 ns/op	        37.7 bytes/key	        23.7 idle-bytes/key
`

// svgBar is a bar as the SVG draws it: its width and its tooltip.
type svgBar struct {
	width float64
	title string
}

// parseSVG checks that doc is well-formed XML with an svg root and returns
// its bars.
func parseSVG(t *testing.T, doc string) []svgBar {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(doc))
	var bars []svgBar
	var cur *svgBar
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Space + " " + el.Name.Local
			}
			if el.Name.Local == "rect" && attr(el, "class") == "bar" {
				w, err := strconv.ParseFloat(attr(el, "width"), 64)
				if err != nil {
					t.Fatalf("bar width: %v", err)
				}
				bars = append(bars, svgBar{width: w})
				cur = &bars[len(bars)-1]
			}
		case xml.CharData:
			if cur != nil {
				cur.title += string(el)
			}
		case xml.EndElement:
			if el.Name.Local == "rect" {
				cur = nil
			}
		}
	}
	if root != "http://www.w3.org/2000/svg svg" {
		t.Fatalf("root element is %q, want an svg", root)
	}
	return bars
}

func attr(el xml.StartElement, name string) string {
	for _, a := range el.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// Each chart is well-formed SVG and each bar's length is its value, on
// one scale per chart, with values computed here from the benchmark lines.
func TestChartsBarsMatchTheirValues(t *testing.T) {
	rs, err := parse(strings.NewReader(chartSample))
	if err != nil {
		t.Fatal(err)
	}
	// Bars by "row · series", each value worked out from chartSample.
	want := map[string]map[string]float64{
		"decide.svg": {
			// ceiling's fastest keys=1/serial run is 40 ns.
			"ulule · keys=1/serial": 200.0 / 40, "golimiter · keys=1/serial": 80.0 / 40, "throttled · keys=1/serial": 190.0 / 40,
		},
		"middleware.svg": {
			// Overheads over bare (10 ns; 5 ns in parallel) and echo-bare (40 ns).
			"ceiling · clients=1/serial": 100, "echo · clients=1/serial": 200, "ulule · clients=1/serial": 400,
			"ceiling · clients=100k/parallel": 200, "ulule · clients=100k/parallel": -3,
		},
		"redis.svg": {
			"ceiling · rules=1/parallel64": 71500, "ulule · rules=1/parallel64": 134600,
			"ceiling · rules=3/parallel64": 30200, "ulule · rules=3/parallel64": 32100,
		},
		"memory.svg": {
			"ceiling · held with 1M keys": 50.4, "ceiling · left after the keys went idle": 0.5,
			"httprate · held with 1M keys": 37.7, "httprate · left after the keys went idle": 23.7,
		},
	}
	cs := charts(rs)
	if len(cs) != len(want) {
		t.Fatalf("%d charts, want %d", len(cs), len(want))
	}
	for _, c := range cs {
		var b strings.Builder
		if err := c.writeSVG(&b); err != nil {
			t.Fatal(err)
		}
		bars := parseSVG(t, b.String())
		expect := want[c.file]
		if len(bars) != len(expect) {
			t.Errorf("%s: %d bars, want %d", c.file, len(bars), len(expect))
		}
		// One scale per chart: the longest bar spans the plot (unless the
		// reference line is further out).
		high := c.ref
		for _, v := range expect {
			high = math.Max(high, v)
		}
		scale := plotWidth / high
		for _, bar := range bars {
			key, _, _ := strings.Cut(bar.title, ":")
			v, ok := expect[key]
			if !ok {
				t.Errorf("%s: unexpected bar %q", c.file, bar.title)
				continue
			}
			if got, want := bar.width, math.Max(v, 0)*scale; math.Abs(got-want) > 0.01 {
				t.Errorf("%s: bar %q is %.2f long, want %.2f (value %v)", c.file, key, got, want, v)
			}
		}
	}
}

// With -charts the charts are written to files and embedded above their
// tables, so that pasting the output into BENCHMARKS.md carries them.
func TestChartsAreWrittenAndEmbeddedAboveTheirTables(t *testing.T) {
	rs, err := parse(strings.NewReader(chartSample))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	embeds, err := writeCharts(dir, "bench/charts", rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"decide.svg", "middleware.svg", "redis.svg", "memory.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if len(parseSVG(t, string(b))) == 0 {
			t.Errorf("%s has no bars", f)
		}
	}
	var out strings.Builder
	render(&out, rs, embeds)
	for _, want := range []string{
		"### In-memory decision: ns/op (allocs/op)\n\n![In-memory decision: each library's time ÷ ceiling's](bench/charts/decide.svg)\n\n| library |",
		"(bench/charts/middleware.svg)\n\n| library |",
		"(bench/charts/redis.svg)\n\n| library |",
		"(bench/charts/memory.svg)\n\n| library |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
