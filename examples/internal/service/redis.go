package service

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisURLForms is what REDIS_URL may be, for error messages and -help.
const RedisURLForms = "redis://[user:password@]host:port[/db] (one server; rediss:// for TLS), " +
	"redis+cluster://[user:password@]host:port[,host:port...] (Redis Cluster: some of its nodes), " +
	"redis+sentinel://[user:password@]host:port[,host:port...]/master[/db] (the Sentinels and the name of the master they watch), " +
	"each with go-redis options as query parameters (?dial_timeout=2s&pool_size=20)"

// A RedisDeployment is what a REDIS_URL names, ready to connect to.
type RedisDeployment struct {
	// Kind is "server", "cluster" or "sentinel".
	Kind string
	// Addrs are the addresses the URL lists: the server, the cluster nodes
	// to start from, or the Sentinels.
	Addrs []string
	// Master is the Sentinel master name; DB the database number (never on
	// a Cluster, which has only database 0).
	Master string
	DB     int

	server   *redis.Options
	cluster  *redis.ClusterOptions
	sentinel *redis.FailoverOptions
}

// ParseRedisURL reads a Redis URL in one of the forms of [RedisURLForms].
// Each form is go-redis's own URL (ParseURL, ParseClusterURL,
// ParseFailoverURL) with the nodes written the way operators list them,
// comma-separated in the host, so every go-redis option works as a query
// parameter. The user and password are always the data nodes' (also a
// Sentinel's master and replicas); a Sentinel's own are the
// sentinel_username and sentinel_password parameters.
//
// Several hosts in a redis:// URL are an error rather than a guess: a
// Cluster taken for one server answers every request whose keys fall in
// several slots with CROSSSLOT.
func ParseRedisURL(raw string) (*RedisDeployment, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w; want %s", err, RedisURLForms)
	}
	scheme, kind, _ := strings.Cut(u.Scheme, "+")
	if scheme != "redis" && scheme != "rediss" {
		return nil, fmt.Errorf("scheme %q: want %s", u.Scheme, RedisURLForms)
	}
	hosts := strings.Split(u.Host, ",")
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return nil, fmt.Errorf("host %q: want host:port: %w", h, err)
		}
	}
	// go-redis's form: the first host in the URL, the others as addr=.
	q := u.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	g := *u
	g.Scheme, g.Host = scheme, hosts[0]
	d := &RedisDeployment{Addrs: hosts}
	switch kind {
	case "":
		if len(hosts) > 1 {
			return nil, fmt.Errorf("%d hosts in a %s:// URL, which names one server: "+
				"for a Cluster write %s+cluster://, for Sentinels %s+sentinel://host:port,.../master", len(hosts), scheme, scheme, scheme)
		}
		g.RawQuery = q.Encode()
		if d.server, err = redis.ParseURL(g.String()); err != nil {
			return nil, err
		}
		d.Kind, d.DB = "server", d.server.DB
	case "cluster":
		if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
			return nil, fmt.Errorf("database %q: a Redis Cluster has only database 0", p)
		}
		g.Path, g.RawQuery = "", q.Encode()
		if d.cluster, err = redis.ParseClusterURL(g.String()); err != nil {
			return nil, err
		}
		d.Kind = "cluster"
	case "sentinel":
		path := strings.Split(strings.Trim(u.Path, "/"), "/")
		if path[0] == "" || len(path) > 2 {
			return nil, fmt.Errorf("path %q: want /master or /master/db, the name of the master the Sentinels watch", u.Path)
		}
		d.Master = path[0]
		q.Set("master_name", path[0])
		if len(path) == 2 {
			q.Set("db", path[1])
		}
		// ParseFailoverURL takes the URL's user for the Sentinels';
		// ours is the data nodes', as in the other forms.
		sentinelUser, sentinelPassword := q.Get("sentinel_username"), q.Get("sentinel_password")
		q.Del("sentinel_username")
		q.Del("sentinel_password")
		if u.User != nil {
			q.Set("username", u.User.Username())
			if pw, ok := u.User.Password(); ok {
				q.Set("password", pw)
			}
		}
		g.User, g.Path, g.RawQuery = nil, "", q.Encode()
		if d.sentinel, err = redis.ParseFailoverURL(g.String()); err != nil {
			return nil, err
		}
		d.sentinel.SentinelUsername, d.sentinel.SentinelPassword = sentinelUser, sentinelPassword
		d.Kind, d.DB = "sentinel", d.sentinel.DB
	default:
		return nil, fmt.Errorf("scheme %q: want %s", u.Scheme, RedisURLForms)
	}
	return d, nil
}

// Client connects to the deployment. Every command is bounded by the
// context the limiter passes (ContextTimeoutEnabled), so that an
// unreachable Redis costs a request the limiter's timeout and not the
// client's own dial and read timeouts; a dial takes at most a second
// unless the URL says otherwise.
func (d *RedisDeployment) Client() redis.UniversalClient {
	switch {
	case d.cluster != nil:
		o := *d.cluster
		o.ContextTimeoutEnabled = true
		o.DialTimeout = orSecond(o.DialTimeout)
		return redis.NewClusterClient(&o)
	case d.sentinel != nil:
		o := *d.sentinel
		o.ContextTimeoutEnabled = true
		o.DialTimeout = orSecond(o.DialTimeout)
		return redis.NewFailoverClient(&o)
	default:
		o := *d.server
		o.ContextTimeoutEnabled = true
		o.DialTimeout = orSecond(o.DialTimeout)
		return redis.NewClient(&o)
	}
}

func orSecond(d time.Duration) time.Duration {
	if d == 0 {
		return time.Second
	}
	return d
}
