package ceiling

import "github.com/ceiling-go/ceiling/internal/failover"

// What the engine's tests name of internal/failover: the cause of a call
// refused by the open breaker, and a request scaled to FailLocal's share.
var (
	errBreakerOpen = failover.ErrBreakerOpen
	localRequest   = failover.Scaled
)
