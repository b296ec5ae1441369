package bench

import (
	"os"
	"strconv"
	"testing"

	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestMain stops the redis-server and the PostgreSQL server the tests may
// have started.
func TestMain(m *testing.M) {
	code := redistest.Main(m)
	pgtest.StopShared()
	os.Exit(code)
}

func itoa(n int) string { return strconv.Itoa(n) }
