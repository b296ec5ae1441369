package bench

import (
	"os"
	"strconv"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestMain stops the redis-server the tests may have started.
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

func itoa(n int) string { return strconv.Itoa(n) }
