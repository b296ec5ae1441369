package ceiling

// FailMode says what the middleware does when the backend cannot decide
// (unreachable, timed out, broken).
type FailMode uint8

const (
	// inherit is the zero value: a rule uses its limiter's mode.
	inherit FailMode = iota
	// FailOpen admits the request without enforcement. It is counted and
	// reported, never silent.
	FailOpen
	// FailClosed answers 503 with Retry-After: nothing is admitted that was
	// not counted.
	FailClosed
)

// String names the mode for logs and metrics.
func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "inherit"
}
