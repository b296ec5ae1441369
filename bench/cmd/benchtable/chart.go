package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// A chart is a horizontal bar chart of one benchmark family: a row per
// library and, in each row, a bar per series (a variant of the benchmark,
// or a second quantity), every bar's length proportional to its value.
type chart struct {
	family string // the family whose table the chart sits above
	file   string // "decide.svg"
	title  string
	note   string // what a bar is and which way is better
	series []string
	rows   []chartRow
	// ref draws a dashed line at this value, labelled refLabel (1 for a
	// ratio to ceiling); zero draws none.
	ref      float64
	refLabel string
	format   func(float64) string
}

type chartRow struct {
	label  string
	values []float64 // per series; NaN where the library did not run it
}

// charts builds the charts readers compare at a glance from one run:
// each library's memory decision time as a ratio to ceiling's, the
// middleware overhead, Redis throughput from 64 goroutines, and bytes per
// key. A chart whose benchmarks are not in results is left out.
func charts(results []result) []chart {
	var out []chart
	add := func(c chart) {
		if len(c.rows) > 0 && len(c.series) > 0 {
			out = append(out, c)
		}
	}

	variants, libs, cells := table(results, "Decide")
	decide := chart{family: "Decide", file: "decide.svg", series: variants, ref: 1, refLabel: "ceiling = 1",
		title:  "In-memory decision: each library's time ÷ ceiling's",
		note:   "ns/op ratio to ceiling in the same run and column; above 1 is slower than ceiling",
		format: func(v float64) string { return num(v) + "×" }}
	for _, lib := range libs {
		if isCeiling(lib) {
			continue
		}
		row := chartRow{label: lib}
		for _, v := range variants {
			mine, theirs := cells[[2]string{v, "ceiling"}], cells[[2]string{v, lib}]
			if mine == nil || theirs == nil || mine.metrics["ns/op"] <= 0 {
				row.values = append(row.values, math.NaN())
				continue
			}
			row.values = append(row.values, theirs.metrics["ns/op"]/mine.metrics["ns/op"])
		}
		decide.rows = append(decide.rows, row)
	}
	add(decide)

	variants, libs, cells = table(results, "Middleware")
	mw := chart{family: "Middleware", file: "middleware.svg", series: variants,
		title:  "Middleware overhead over the bare framework",
		note:   "ns per request added to a handler that does nothing; lower is better",
		format: func(v float64) string { return num(v) + " ns" }}
	for _, lib := range libs {
		if isBase(lib) {
			continue
		}
		row := chartRow{label: lib}
		for _, v := range variants {
			r, base := cells[[2]string{v, lib}], cells[[2]string{v, baseOf(lib)}]
			if r == nil || base == nil {
				row.values = append(row.values, math.NaN())
				continue
			}
			o, _ := overheadNs(r, base)
			row.values = append(row.values, o)
		}
		mw.rows = append(mw.rows, row)
	}
	add(mw)

	variants, libs, cells = table(results, "Redis")
	redis := chart{family: "Redis", file: "redis.svg",
		title:  "Redis throughput from 64 goroutines",
		note:   "decisions per second on one local redis-server; higher is better",
		format: func(v float64) string { return num(v) + "/s" }}
	for _, v := range variants {
		if strings.Contains(v, "parallel64") {
			redis.series = append(redis.series, v)
		}
	}
	for _, lib := range libs {
		row := chartRow{label: lib}
		for _, v := range redis.series {
			r := cells[[2]string{v, lib}]
			if d, ok := r.metric("decisions/s"); ok {
				row.values = append(row.values, d)
			} else {
				row.values = append(row.values, math.NaN())
			}
		}
		redis.rows = append(redis.rows, row)
	}
	add(redis)

	_, libs, cells = table(results, "Keys1M")
	keys := chart{family: "Keys1M", file: "memory.svg", series: []string{"held with 1M keys", "left after the keys went idle"},
		title:  "Memory per key",
		note:   "bytes of heap per key; lower is better",
		format: func(v float64) string { return num(v) + " B" }}
	for _, lib := range libs {
		r := cells[[2]string{"", lib}]
		row := chartRow{label: lib}
		for _, m := range []string{"bytes/key", "idle-bytes/key"} {
			if v, ok := r.metric(m); ok {
				row.values = append(row.values, v)
			} else {
				row.values = append(row.values, math.NaN())
			}
		}
		keys.rows = append(keys.rows, row)
	}
	add(keys)
	return out
}

// metric returns one of r's values; r may be nil.
func (r *result) metric(unit string) (float64, bool) {
	if r == nil {
		return 0, false
	}
	v, ok := r.metrics[unit]
	return v, ok
}

// table returns a family's variants and libraries in the order they first
// appear, and its results by (variant, library).
func table(results []result, fam string) (variants, libs []string, cells map[[2]string]*result) {
	cells = map[[2]string]*result{}
	for i := range results {
		r := &results[i]
		if r.family != fam {
			continue
		}
		if !contains(variants, r.variant) {
			variants = append(variants, r.variant)
		}
		if !contains(libs, r.lib) {
			libs = append(libs, r.lib)
		}
		cells[[2]string{r.variant, r.lib}] = r
	}
	return variants, libs, cells
}

// The chart's geometry, in SVG user units (pixels at 100%).
const (
	chartWidth = 760
	labelWidth = 160 // row labels, right-aligned before the bars
	valueRoom  = 100 // value labels after the longest bar
	plotWidth  = chartWidth - labelWidth - valueRoom
	barHeight  = 14
	barGap     = 2  // between the bars of one row
	rowGap     = 10 // between rows
)

// palette colours the series; it is readable on light and dark pages.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948"}

// writeSVG draws c. Each bar is a rect of class "bar" whose width is its
// value times one scale for the whole chart (negative values, noise below
// a base, draw no bar); its title element names the row, series and value.
func (c *chart) writeSVG(w io.Writer) error {
	top := 56.0
	if len(c.series) > 1 {
		top += 18 * float64(len(c.series))
	}
	rowHeight := float64(len(c.series)*(barHeight+barGap)-barGap) + rowGap
	height := top + rowHeight*float64(len(c.rows)) + 24

	high := c.ref
	for _, r := range c.rows {
		for _, v := range r.values {
			if !math.IsNaN(v) && v > high {
				high = v
			}
		}
	}
	scale := 0.0
	if high > 0 {
		scale = plotWidth / high
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%.0f" viewBox="0 0 %d %.0f" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12" role="img" aria-label="%s">`+"\n",
		chartWidth, height, chartWidth, height, esc(c.title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="12" y="22" font-size="15" font-weight="bold" fill="#222">%s</text>`+"\n", esc(c.title))
	fmt.Fprintf(&b, `<text x="12" y="40" fill="#555">%s</text>`+"\n", esc(c.note))
	if len(c.series) > 1 {
		for i, s := range c.series {
			y := 56 + 18*float64(i)
			fmt.Fprintf(&b, `<rect x="12" y="%.0f" width="12" height="12" fill="%s"/><text x="30" y="%.0f" fill="#222">%s</text>`+"\n",
				y-2, palette[i%len(palette)], y+8, esc(s))
		}
	}
	for i, r := range c.rows {
		y := top + rowHeight*float64(i)
		mid := y + (rowHeight-rowGap)/2
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle" fill="#222">%s</text>`+"\n",
			labelWidth-8, mid, esc(r.label))
		for j, v := range r.values {
			if math.IsNaN(v) {
				continue
			}
			by := y + float64(j*(barHeight+barGap))
			width := math.Max(v, 0) * scale
			fmt.Fprintf(&b, `<rect class="bar" x="%d" y="%.1f" width="%.2f" height="%d" fill="%s"><title>%s · %s: %s</title></rect>`+"\n",
				labelWidth, by, width, barHeight, palette[j%len(palette)], esc(r.label), esc(c.series[j]), esc(c.format(v)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" dominant-baseline="middle" fill="#222">%s</text>`+"\n",
				float64(labelWidth)+width+4, by+barHeight/2, esc(c.format(v)))
		}
	}
	if c.ref > 0 {
		x := float64(labelWidth) + c.ref*scale
		fmt.Fprintf(&b, `<line x1="%.2f" y1="%.0f" x2="%.2f" y2="%.0f" stroke="#222" stroke-dasharray="4 3"/>`+"\n", x, top-4, x, height-20)
		fmt.Fprintf(&b, `<text x="%.2f" y="%.0f" text-anchor="middle" fill="#222">%s</text>`+"\n", x, height-6, esc(c.refLabel))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s)) //nolint:errcheck // a strings.Builder does not fail
	return b.String()
}
