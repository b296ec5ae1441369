package failover

import (
	"errors"
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

// A timeout opens the breaker only once the probe it started fails too: an
// answered probe clears the run, a probe this process could not make
// leaves it for the next timeout's probe, and any other failure opens at
// once after Failures in a row.
func TestTimeoutsWaitForTheProbesVerdict(t *testing.T) {
	timeout := errors.New("timeout")
	var probes int
	b := New(Config{Failures: 2, CoolDown: time.Hour, MaxCoolDown: time.Hour}, time.Now,
		func(Transition) {}, func() {}, func(err error) bool { return err == timeout }, func() { probes++ })
	b.Failure(timeout)
	b.Failure(timeout)
	if !b.Closed() || probes != 1 {
		t.Fatalf("two timeouts: closed %v, %d probes; want closed, one probe", b.Closed(), probes)
	}
	b.Confirmed(nil)
	if b.Fails() != 0 {
		t.Errorf("an answered probe left %d failures", b.Fails())
	}
	b.Failure(timeout)
	b.NoVerdict()
	b.Failure(timeout)
	if !b.Closed() || probes != 3 {
		t.Fatalf("after no verdict: closed %v, %d probes; want closed, a new probe", b.Closed(), probes)
	}
	b.Confirmed(timeout)
	if b.Closed() {
		t.Fatal("a failed probe after two timeouts left the breaker closed")
	}
	b.Close()
	b.Failure(errors.New("refused"))
	if b.Failure(errors.New("refused")); b.Closed() || probes != 3 {
		t.Errorf("two refusals: closed %v, %d probes; want open, no probe", b.Closed(), probes)
	}
}
