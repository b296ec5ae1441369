package main

import (
	"strings"
	"testing"
)

const sample3 = `machine: 2 cores
round 1 of 2
BenchmarkDecide/keys=1/serial/ceiling-2   	 1000	       100 ns/op	       90.0 cpu-ns/op
BenchmarkDecide/keys=1/serial/ceiling-store-2 1000	       50 ns/op
BenchmarkDecide/keys=1/serial/golimiter-2 	 1000	       80.0 ns/op
BenchmarkDecide/keys=1/serial/ulule-2     	 1000	       200 ns/op
BenchmarkMiddleware/clients=1/serial/bare-2    1000	       10.0 ns/op
BenchmarkMiddleware/clients=1/serial/ceiling-2 1000	      110 ns/op
BenchmarkMiddleware/clients=1/serial/ulule-2   1000	      410 ns/op
round 2 of 2
BenchmarkDecide/keys=1/serial/ceiling-2   	 1000	       150 ns/op
BenchmarkDecide/keys=1/serial/golimiter-2 	 1000	       100 ns/op
BenchmarkDecide/keys=1/serial/ulule-2     	 1000	       190 ns/op
BenchmarkMiddleware/clients=1/serial/bare-2    1000	       20.0 ns/op
BenchmarkMiddleware/clients=1/serial/ceiling-2 1000	      220 ns/op
BenchmarkMiddleware/clients=1/serial/ulule-2   1000	      420 ns/op
BenchmarkExact/ceiling-2 1 5 ns/op 100 admitted
`

func TestRoundsShowEachColumnsSpreadAndRatios(t *testing.T) {
	s, err := parse(strings.NewReader(sample3))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	render(&b, s)
	out := b.String()
	for _, want := range []string{
		// ceiling 100 then 150; golimiter (the best peer) 80 then 100.
		"| Decide | keys=1/serial | 1.50× | 1.25× (golimiter) | 1.25, 1.50 |",
		// Overheads over bare: ceiling 100 then 200, ulule 400 then 400.
		"| Middleware | clients=1/serial | 2.00× | 1.00× (ulule) | 0.25, 0.50 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Exact") {
		t.Errorf("an experiment, run once, has no rounds:\n%s", out)
	}
}
