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

func TestParseRedisURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		kind   string
		addrs  []string
		master string
		db     int
		check  func(t *testing.T, d *RedisDeployment)
	}{
		{url: "redis://10.0.0.5:6379/2", kind: "server", addrs: []string{"10.0.0.5:6379"}, db: 2},
		{url: "rediss://u:p%40ss@r.example.com:6380/0?dial_timeout=3s&pool_size=7", kind: "server", addrs: []string{"r.example.com:6380"},
			check: func(t *testing.T, d *RedisDeployment) {
				o := d.server
				if o.Username != "u" || o.Password != "p@ss" || o.TLSConfig == nil || o.DialTimeout != 3*time.Second || o.PoolSize != 7 {
					t.Errorf("options %+v: want user u, password p@ss, TLS, dial timeout 3s, pool size 7", o)
				}
			}},
		{url: "redis+cluster://:secret@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?read_timeout=2s", kind: "cluster",
			addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
			check: func(t *testing.T, d *RedisDeployment) {
				o := d.cluster
				if !slices.Equal(o.Addrs, []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}) || o.Password != "secret" || o.ReadTimeout != 2*time.Second || o.TLSConfig != nil {
					t.Errorf("options %+v: want the three nodes, password secret, read timeout 2s, no TLS", o)
				}
			}},
		{url: "rediss+cluster://10.0.0.1:6379", kind: "cluster", addrs: []string{"10.0.0.1:6379"},
			check: func(t *testing.T, d *RedisDeployment) {
				if d.cluster.TLSConfig == nil {
					t.Error("rediss+cluster without TLS")
				}
			}},
		{url: "redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/3?sentinel_password=sp", kind: "sentinel",
			addrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"}, master: "mymaster", db: 3,
			check: func(t *testing.T, d *RedisDeployment) {
				o := d.sentinel
				if o.MasterName != "mymaster" || !slices.Equal(o.SentinelAddrs, []string{"10.0.0.1:26379", "10.0.0.2:26379"}) ||
					o.Username != "app" || o.Password != "pw" || o.SentinelUsername != "" || o.SentinelPassword != "sp" || o.DB != 3 {
					t.Errorf("options %+v: want master mymaster on both sentinels, app:pw for the data nodes, sp for the sentinels, db 3", o)
				}
			}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			d, err := ParseRedisURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			if d.Kind != tc.kind || !slices.Equal(d.Addrs, tc.addrs) || d.Master != tc.master || d.DB != tc.db {
				t.Errorf("got %s %v master %q db %d; want %s %v master %q db %d", d.Kind, d.Addrs, d.Master, d.DB, tc.kind, tc.addrs, tc.master, tc.db)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

func TestParseRedisURLRefusesWhatItWouldGuess(t *testing.T) {
	for url, why := range map[string]string{
		"redis://h1:6379,h2:6379":                  "redis+cluster://",
		"http://localhost:6379":                    "scheme",
		"redis+ring://h1:6379":                     "scheme",
		"redis+cluster://h1:6379/2":                "only database 0",
		"redis+sentinel://h1:26379":                "name of the master",
		"redis+sentinel://h1:26379/m/0/extra":      "name of the master",
		"redis://localhost":                        "host:port",
		"redis://localhost:6379?dial_timeout=soon": "dial_timeout",
		"redis://localhost:6379?no_such_option=1":  "no_such_option",
	} {
		if _, err := ParseRedisURL(url); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseRedisURL(%q) = %v, want an error saying %q", url, err, why)
		}
	}
}

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
		time.Sleep(100 * time.Millisecond)
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
