// Package cputime reads the CPU time this process has used, for the
// benchmarks that report it per operation as cpu-ns/op beside ns/op: on a
// machine shared with other work it moves far less than the wall clock.
package cputime

import (
	"testing"
	"time"
)

// Report reports the process's CPU time since start, a value of [Now],
// per operation of b as cpu-ns/op. From several goroutines it is the CPU
// every core spent.
func Report(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(Now()-start)/float64(b.N), "cpu-ns/op")
}
