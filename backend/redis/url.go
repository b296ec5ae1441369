package redis

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// URLForms are the Redis URLs [ParseURL] reads, for messages and help text.
const URLForms = "redis://[user:password@]host:port[/db] (one server; rediss:// for TLS), " +
	"redis+cluster://[user:password@]host:port[,host:port...] (Redis Cluster: some of its nodes), " +
	"redis+sentinel://[user:password@]host:port[,host:port...]/master[/db] (the Sentinels and the name of the master they watch), " +
	"each with go-redis options as query parameters (?dial_timeout=2s&pool_size=20)"

// A URL is a Redis deployment a URL names, with the go-redis options to
// reach it: exactly one of Server, Cluster and Sentinel is set. Change its
// options before calling [URL.Client].
type URL struct {
	// Kind is "server", "cluster" or "sentinel".
	Kind string
	// Addrs are the server, the Cluster nodes to start from, or the Sentinels.
	Addrs []string
	// Master is a Sentinel deployment's master name.
	Master string
	// DB is the database number (always 0 on a Cluster).
	DB int

	Server   *redis.Options
	Cluster  *redis.ClusterOptions
	Sentinel *redis.FailoverOptions
}

// ParseURL reads a Redis URL in a form of [URLForms]: go-redis's own URLs
// with the nodes comma-separated in the host, every go-redis option a
// query parameter. The user and password are the data nodes' (the
// Sentinels' are sentinel_username and sentinel_password). The options
// have ContextTimeoutEnabled set, as the [Store] wants, and a dial timeout
// of a second unless dial_timeout says otherwise. Several hosts in a
// redis:// URL are an error: a Cluster taken for one server answers
// CROSSSLOT.
func ParseURL(raw string) (*URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// net/url's error quotes the URL, password included
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("ceilingredis: the URL does not parse: %w; want %s", err, URLForms)
	}
	scheme, kind, _ := strings.Cut(u.Scheme, "+")
	if scheme != "redis" && scheme != "rediss" {
		return nil, fmt.Errorf("ceilingredis: scheme %q: want %s", u.Scheme, URLForms)
	}
	hosts := strings.Split(u.Host, ",")
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return nil, fmt.Errorf("ceilingredis: host %q: want host:port: %w", h, err)
		}
	}
	// go-redis's spelling: the first host in the URL, the others as addr=.
	q := u.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	g := *u
	g.Scheme, g.Host = scheme, hosts[0]
	d := &URL{Addrs: hosts}
	switch kind {
	case "":
		err = d.server(&g, q, len(hosts))
	case "cluster":
		err = d.cluster(&g, q)
	case "sentinel":
		err = d.sentinel(&g, q)
	default:
		err = fmt.Errorf("scheme %q: want %s", u.Scheme, URLForms)
	}
	if err != nil {
		return nil, fmt.Errorf("ceilingredis: %w", err)
	}
	return d, nil
}

func (d *URL) server(g *url.URL, q url.Values, hosts int) error {
	if hosts > 1 {
		return fmt.Errorf("%d hosts in a %s:// URL, which names one server: "+
			"for a Cluster write %[2]s+cluster://, for Sentinels %[2]s+sentinel://host:port,.../master", hosts, g.Scheme)
	}
	g.RawQuery = q.Encode()
	o, err := redis.ParseURL(g.String())
	if err != nil {
		return err
	}
	o.ContextTimeoutEnabled, o.DialTimeout = true, orSecond(o.DialTimeout)
	d.Kind, d.DB, d.Server = "server", o.DB, o
	return nil
}

func (d *URL) cluster(g *url.URL, q url.Values) error {
	if p := strings.Trim(g.Path, "/"); p != "" && p != "0" {
		return fmt.Errorf("database %q: a Redis Cluster has only database 0", p)
	}
	g.Path, g.RawQuery = "", q.Encode()
	o, err := redis.ParseClusterURL(g.String())
	if err != nil {
		return err
	}
	o.ContextTimeoutEnabled, o.DialTimeout = true, orSecond(o.DialTimeout)
	d.Kind, d.Cluster = "cluster", o
	return nil
}

func (d *URL) sentinel(g *url.URL, q url.Values) error {
	path := strings.Split(strings.Trim(g.Path, "/"), "/")
	if path[0] == "" || len(path) > 2 {
		return fmt.Errorf("path %q: want /master or /master/db, the name of the master the Sentinels watch", g.Path)
	}
	q.Set("master_name", path[0])
	if len(path) == 2 {
		q.Set("db", path[1])
	}
	// ParseFailoverURL reads the URL's user as the Sentinels'; here it is
	// the data nodes', as in the other forms.
	sentinelUser, sentinelPassword := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	if g.User != nil {
		q.Set("username", g.User.Username())
		if pw, ok := g.User.Password(); ok {
			q.Set("password", pw)
		}
	}
	g.User, g.Path, g.RawQuery = nil, "", q.Encode()
	o, err := redis.ParseFailoverURL(g.String())
	if err != nil {
		return err
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPassword
	o.ContextTimeoutEnabled, o.DialTimeout = true, orSecond(o.DialTimeout)
	d.Kind, d.Master, d.DB, d.Sentinel = "sentinel", path[0], o.DB, o
	return nil
}

// Client returns a client for the deployment with the options as they are
// now.
func (d *URL) Client() redis.UniversalClient {
	switch {
	case d.Cluster != nil:
		return redis.NewClusterClient(d.Cluster)
	case d.Sentinel != nil:
		return redis.NewFailoverClient(d.Sentinel)
	case d.Server != nil:
		return redis.NewClient(d.Server)
	}
	panic(errors.New("ceilingredis: URL.Client on a URL that ParseURL did not return"))
}

func orSecond(d time.Duration) time.Duration {
	if d == 0 {
		return time.Second
	}
	return d
}
