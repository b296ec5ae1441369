package ceiling

import (
	"runtime"
	"testing"
	"time"
)

// A starved spell is seen from its first timeout: the scheduler's latency
// histogram holds too few samples then (here, none: the baseline is taken
// just before the question), but a yield of the CPU waits behind the busy
// goroutines as a backend's reply would. A process that runs its
// goroutines promptly is not starved.
func TestLagMeterSeesAStarvedProcessAtOnce(t *testing.T) {
	const timeout = 20 * time.Millisecond
	var quiet lagMeter
	quiet.tick(time.Now())
	if quiet.starved(timeout) {
		t.Error("a quiet process counted as starved")
	}
	stop := burn(16 * runtime.GOMAXPROCS(0))
	defer stop()
	time.Sleep(50 * time.Millisecond) // the burners fill the run queues
	var m lagMeter
	m.tick(time.Now())
	if !m.starved(timeout) {
		t.Error("32 goroutines burning 2 CPUs: not starved")
	}
	if at := m.slowYield.Load(); at == 0 {
		t.Error("the slow yield was not remembered")
	}
	stop()
	if !m.starved(timeout) {
		t.Error("a slow yield less than a second ago is forgotten")
	}
}
