package bench

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time the process has used, every thread and the
// garbage collector included. On a machine shared with other work it moves
// far less than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time since cpu per operation, as
// cpu-ns/op. From several goroutines it is the CPU every core spent.
func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}
