package service

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// Each URL form reaches its deployment: the limiter that Backend
// configures passes Check (Redis answers and really rejects) and decides
// requests whose rules fall in different hash slots, which a Cluster taken
// for one server would answer with CROSSSLOT.
func TestEachURLFormReachesItsDeployment(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		limitThree(t, "redis://"+redistest.Shared(t).Addr+"/0")
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		limitThree(t, "redis+cluster://"+strings.Join(redistest.SharedCluster(t).Addrs(), ","))
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		s := redistest.Sentinel(t)
		url := "redis+sentinel://" + s.Sentinel.Addr + "/" + redistest.SentinelMaster
		limitThree(t, url)
		// After a failover the client finds the promoted replica.
		s.Failover(t)
		limitThree(t, url)
	})
}

// limitThree runs three rules of limit 3 through the limiter Backend
// configures for url: exactly 3 requests of 5 pass, and none fails open.
func limitThree(t *testing.T, url string) {
	t.Helper()
	var logs strings.Builder
	opts, closeFn, err := (&Config{RedisURL: url, RedisPrefix: redistest.KeyPrefix(t)}).Backend(slog.New(slog.NewTextHandler(&logs, nil)), "p")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	var rules []ceiling.Rule
	for _, name := range []string{"a", "b", "c"} {
		rules = append(rules, ceiling.Rule{Name: name, Key: ceiling.Static(name), Limit: 3, Period: time.Minute, FailMode: ceiling.FailClosed})
	}
	limiter, err := ceiling.New(rules, append(opts, ceiling.WithTimeout(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Right after a failover the client may take a few tries to find the
	// new master.
	var checkErr error
	for range 50 {
		if checkErr = limiter.Check(ctx); checkErr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the Redis client finding the new master after a failover
	}
	if checkErr != nil {
		t.Fatalf("%s: Check: %v\n%s", url, checkErr, logs.String())
	}
	h := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var got []int
	for range 5 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		got = append(got, w.Code)
	}
	if want := []int{200, 200, 200, 429, 429}; !slices.Equal(got, want) {
		t.Errorf("%s: statuses %v, want %v\n%s", url, got, want, logs.String())
	}
}
