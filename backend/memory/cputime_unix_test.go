//go:build unix

package memory

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, every thread and the
// garbage collector included. On a machine shared with other work it moves
// far less than the wall clock: the benchmarks report it per operation as
// cpu-ns/op beside ns/op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
