package ceiling

import (
	"os"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestMain lets redistest report the Redis tests that skipped for want of
// redis-server, and stop what it started.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
