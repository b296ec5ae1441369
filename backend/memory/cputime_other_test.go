//go:build !unix

package memory

import "time"

// cpuTime is unknown here: cpu-ns/op is reported as 0.
func cpuTime() time.Duration { return 0 }
