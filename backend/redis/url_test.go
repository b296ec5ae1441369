package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Each form names its deployment and carries the URL's options, the data
// nodes' credentials and the Sentinels' apart, with ContextTimeoutEnabled
// and a one-second dial timeout unless the URL sets one.
func TestParseURLForms(t *testing.T) {
	d, err := ParseURL("rediss://app:pw@10.0.0.1:6380/2?pool_size=7")
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != "server" || d.DB != 2 || d.Server == nil || d.Server.Addr != "10.0.0.1:6380" ||
		d.Server.Username != "app" || d.Server.Password != "pw" || d.Server.PoolSize != 7 ||
		d.Server.TLSConfig == nil || !d.Server.ContextTimeoutEnabled || d.Server.DialTimeout != time.Second {
		t.Errorf("server URL parsed as %+v, options %+v", d, d.Server)
	}

	d, err = ParseURL("redis+cluster://app:pw@10.0.0.1:7000,10.0.0.2:7000?dial_timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != "cluster" || d.Cluster == nil || strings.Join(d.Cluster.Addrs, ",") != "10.0.0.1:7000,10.0.0.2:7000" ||
		d.Cluster.Password != "pw" || !d.Cluster.ContextTimeoutEnabled || d.Cluster.DialTimeout != 3*time.Second {
		t.Errorf("cluster URL parsed as %+v, options %+v", d, d.Cluster)
	}

	d, err = ParseURL("redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/3?sentinel_password=spw")
	if err != nil {
		t.Fatal(err)
	}
	if s := d.Sentinel; d.Kind != "sentinel" || d.Master != "mymaster" || d.DB != 3 || s == nil ||
		s.MasterName != "mymaster" || strings.Join(s.SentinelAddrs, ",") != "10.0.0.1:26379,10.0.0.2:26379" ||
		s.Username != "app" || s.Password != "pw" || s.SentinelPassword != "spw" || !s.ContextTimeoutEnabled {
		t.Errorf("sentinel URL parsed as %+v, options %+v", d, d.Sentinel)
	}
}

// A URL that could be read two ways, or names nothing connectable, is an
// error that says what to write.
func TestParseURLRefusesAmbiguity(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://10.0.0.1:6379,10.0.0.2:6379":   "redis+cluster://",
		"redis+cluster://10.0.0.1:7000/1":       "only database 0",
		"redis+sentinel://10.0.0.1:26379":       "/master",
		"redis+sentinel://10.0.0.1:26379/m/1/2": "/master",
		"http://10.0.0.1:6379":                  "want redis://",
		"redis+ring://10.0.0.1:6379":            "want redis://",
		"redis://10.0.0.1":                      "host:port",
		"redis://10.0.0.1:6379/0?no_such=1":     "no_such",
	} {
		if _, err := ParseURL(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v, want an error naming %q", raw, err, want)
		}
	}
}

// The client each form makes reaches a real deployment of its kind, and a
// Store on it decides: a single server, a three-master Cluster through one
// of its nodes, and a master found through its Sentinel.
func TestParseURLClientsDecide(t *testing.T) {
	single := redistest.Shared(t)
	cluster := redistest.SharedCluster(t)
	sentinel := redistest.Sentinel(t)
	for _, raw := range []string{
		"redis://" + single.Addr + "/0",
		"redis+cluster://" + cluster.Nodes[0].Addr,
		"redis+sentinel://" + sentinel.Sentinel.Addr + "/" + redistest.SentinelMaster,
	} {
		t.Run(raw[:strings.Index(raw, ":")], func(t *testing.T) {
			d, err := ParseURL(raw)
			if err != nil {
				t.Fatal(err)
			}
			client := d.Client()
			defer client.Close()
			switch d.Kind {
			case "cluster":
				if _, ok := client.(*redis.ClusterClient); !ok {
					t.Fatalf("a cluster URL made a %T", client)
				}
			case "sentinel":
				// The Sentinel's master answers writes as the master.
				if role, err := client.Do(context.Background(), "ROLE").Slice(); err != nil || len(role) == 0 || role[0] != "master" {
					t.Fatalf("ROLE through the Sentinel URL = %v, %v", role, err)
				}
			}
			s := New(client, WithPrefix(redistest.KeyPrefix(t)))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req := backend.Request{Key: "url", Limit: 1, Period: time.Minute, Cost: 1}
			for i, want := range []bool{true, false} {
				res, err := s.Decide(ctx, []backend.Request{req})
				if err != nil {
					t.Fatal(err)
				}
				if res[0].Allowed != want {
					t.Fatalf("decision %d on %s: allowed = %v, want %v", i+1, d.Kind, res[0].Allowed, want)
				}
			}
		})
	}
}

// A URL that does not parse is refused without quoting it: it may hold a
// password, and the error goes to a start-up log.
func TestParseURLErrorNamesNoPassword(t *testing.T) {
	for _, raw := range []string{"redis://:tail-secret@127.0.0.1:x/0", "redis://u:tail%zzsecret@127.0.0.1/0"} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Fatalf("ParseURL(%q) accepted it", raw)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL's error quotes the password: %v", err)
		}
	}
}
