package failover

import (
	"testing"
	"time"
)

// The jitter only ever shortens the interval, by at most a quarter.
func TestProbeJitterStaysWithinTheInterval(t *testing.T) {
	for range 1000 {
		if d := Jittered(time.Second); d > time.Second || d < 750*time.Millisecond {
			t.Fatalf("Jittered(1s) = %v, want within [750ms, 1s]", d)
		}
	}
}
