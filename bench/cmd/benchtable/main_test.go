package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkDecide/keys=1/serial/ceiling-2   	 1000000	       50.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecide/keys=1/serial/ceiling-2   	 1000000	       40.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecide/keys=1/serial/ulule-2     	 1000000	      200 ns/op	      24 B/op	       2 allocs/op
BenchmarkDecide/keys=1/serial/golimiter-2 	 1000000	       80.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkDecide/keys=1/serial/throttled-2 	 1000000	      190 ns/op	         0.0000051 errors/op	      32 B/op	       2 allocs/op
BenchmarkMiddleware/clients=1/serial/bare-2      	 1000000	       10.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkMiddleware/clients=1/serial/echo-bare-2 	 1000000	       40.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkMiddleware/clients=1/serial/ceiling-2   	 1000000	      110 ns/op	      80 B/op	       4 allocs/op
BenchmarkMiddleware/clients=1/serial/echo-2      	 1000000	      240 ns/op	      80 B/op	       1 allocs/op
BenchmarkMiddleware/clients=1/serial/ulule-2     	 1000000	      410 ns/op	     216 B/op	      14 allocs/op
BenchmarkExact/throttled-2 	       1	 391415057 ns/op	        27.00 admitted	       973.0 errors	       389.0 ms	         0 rejected
PASS
`

func TestParseKeepsTheFastestRunOfEachBenchmark(t *testing.T) {
	rs, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rs), 10; got != want {
		t.Fatalf("parsed %d benchmarks, want %d", got, want)
	}
	r := rs[0]
	if r.family != "Decide" || r.variant != "keys=1/serial" || r.lib != "ceiling" {
		t.Fatalf("first result is %s %q %s", r.family, r.variant, r.lib)
	}
	if got, want := r.metrics["ns/op"], 40.0; got != want {
		t.Fatalf("ceiling ns/op = %v, want the faster run's %v", got, want)
	}
	if got, want := rs[9].metrics["errors"], 973.0; got != want {
		t.Fatalf("throttled errors = %v, want %v", got, want)
	}
	if got, want := rs[9].variant, ""; got != want {
		t.Fatalf("a benchmark with only a library level has variant %q", got)
	}
}

func TestRenderComparesCeilingWithTheBestPeer(t *testing.T) {
	rs, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	render(&b, rs, nil)
	out := b.String()
	for _, want := range []string{
		"| ceiling | 40 (0) |",
		"| ulule | 200 (2) |",
		"| throttled | 190 (2), 5.1e-06 errors/op |",
		// 40 ns against golimiter's 80.
		"| **ceiling ÷ best peer** (ns/op) | **0.50×** (golimiter) |",
		// Overheads: ceiling 110-10, echo 240-40 (its own base), ulule 410-10.
		"| bare | base: 10 |",
		"| ceiling | 100 (4) |",
		"| echo | 200 (1) |",
		"| ulule | 400 (14) |",
		"| **ceiling ÷ best peer** (overhead) | **0.50×** (echo) |",
		// Echo sends no rate-limit headers: among the peers that do, ulule.
		"| **ceiling ÷ best peer that sends rate-limit headers** (overhead) | **0.25×** (ulule) |",
		"| throttled | ✗ 27 admitted, 0 rejected, 973 errors (389 ms) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestNum(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{{0, "0"}, {0.05082, "0.05"}, {12.34, "12.3"}, {100, "100"}, {234.5, "234"}, {31894, "31.9k"}, {2_500_000, "2.50M"}} {
		if got := num(c.in); got != c.want {
			t.Errorf("num(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestRenderComparesThePublicPathWithTheStoreAlone(t *testing.T) {
	rs, err := parse(strings.NewReader(`BenchmarkDecide/keys=1/serial/ceiling-2        1000000   120 ns/op
BenchmarkDecide/keys=1/serial/ceiling-decide-2 1000000    90 ns/op
BenchmarkDecide/keys=1/serial/ceiling-store-2  1000000    60 ns/op
BenchmarkDecide/keys=1/serial/golimiter-2      1000000    80 ns/op
`))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	render(&b, rs, nil)
	out := b.String()
	for _, want := range []string{
		// A ceiling row is never another ceiling row's "best peer".
		"| **ceiling ÷ best peer** (ns/op) | **1.50×** (golimiter) |",
		"| **ceiling-store ÷ best peer** (ns/op) | **0.75×** (golimiter) |",
		"| **ceiling ÷ ceiling-store** (ns/op) | **2×** (ceiling-store) |",
		"| **ceiling-decide ÷ ceiling-store** (ns/op) | **1.50×** (ceiling-store) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestRedisCellShowsErrors(t *testing.T) {
	rs, err := parse(strings.NewReader("BenchmarkRedisKeys/keys=1/parallel64/throttled-2 1000 140000 ns/op 7142 decisions/s 0.5979 errors/op 20.6 cmds/op 13.8 trips/op 27.9 srvcalls/op 229 allocs/op\n"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	render(&b, rs, nil)
	if want := "| throttled | 7142/s · 20.6 cmd · 13.8 rtt · 27.9 srv · 229 allocs · 0.60 errors/op |"; !strings.Contains(b.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, b.String())
	}
}

// The Redis keys benchmark gets a second table of the client's CPU per
// decision, with its own ratio row, and its pinned columns sit beside the
// others.
func TestRenderShowsRedisKeysClientCPU(t *testing.T) {
	const lines = `BenchmarkRedisKeys/keys=1/serial/ceiling-decide-2 	 1000	 40000 ns/op	 1.000 cmds/op	 20000 cpu-ns/op	 1.000 trips/op	 4.000 srvcalls/op	 29 allocs/op
BenchmarkRedisKeys/keys=1/serial/ulule-2 	 1000	 30000 ns/op	 1.000 cmds/op	 16000 cpu-ns/op	 1.000 trips/op	 3.000 srvcalls/op	 17 allocs/op
BenchmarkRedisKeys/keys=1/serial-pinned/ceiling-decide 	 1000	 35000 ns/op	 1.000 cmds/op	 18000 cpu-ns/op	 1.000 trips/op	 4.000 srvcalls/op	 29 allocs/op
BenchmarkRedisKeys/keys=1/serial-pinned/ulule 	 1000	 30000 ns/op	 1.000 cmds/op	 15000 cpu-ns/op	 1.000 trips/op	 3.000 srvcalls/op	 17 allocs/op
`
	rs, err := parse(strings.NewReader(lines))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	render(&b, rs, nil)
	out := b.String()
	for _, want := range []string{
		"| library | keys=1/serial | keys=1/serial-pinned |",
		"### Client CPU per decision",
		"| ceiling-decide | 20 µs | 18 µs |",
		"| **ceiling-decide ÷ best peer** (cpu-ns/op) | **1.25×** (ulule) | **1.20×** (ulule) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
