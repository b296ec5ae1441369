package check_test

import (
	"os"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestMain stops the Redis servers the tests started and reports the
// tests that skipped for want of redis-server.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
