//go:build unix

package cputime

import "testing"

// Work the process does shows in Now: it never goes back, and a busy loop
// moves it forward.
func TestNowCountsThisProcesssWork(t *testing.T) {
	start := Now()
	if start <= 0 {
		t.Fatalf("Now() = %v, want the CPU time used so far", start)
	}
	sink := 0
	for Now() == start {
		for i := range 1_000_000 {
			sink += i
		}
	}
	if end := Now(); end < start {
		t.Errorf("Now() went back from %v to %v (sink %d)", start, end, sink)
	}
}
