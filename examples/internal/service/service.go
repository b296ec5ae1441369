// Package service is what the example services share: their settings from
// flags and the environment, the choice of backend (Redis when REDIS_URL is
// set, Postgres when DATABASE_URL is, the in-process memory store
// otherwise, loudly), the client-address
// key, and serving until a signal. Each example's main package holds
// everything about its endpoint; this package holds only the plumbing.
package service

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingpg "github.com/ceiling-go/ceiling/backend/postgres"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultAddr is where the services listen without -addr or ADDR: loopback
// only, so that a service started by hand is not exposed.
const DefaultAddr = "127.0.0.1:8080"

// DefaultAdminAddr is where the services serve GET /healthz and GET
// /metrics without -admin or ADMIN_ADDR: loopback, whatever -addr says. The
// health report tells whoever reads it when the limits are off ("degraded",
// "fail_mode": "open") and the metrics count each rule's traffic, so they
// are for the operator's probes and scrapers, never the public listener.
const DefaultAdminAddr = "127.0.0.1:9090"

// Config holds the settings both services take. The zero value means the
// memory backend, no trusted proxies and plain SHA-256 stored keys.
type Config struct {
	// Addr is the listen address (-addr, else ADDR, else [DefaultAddr]).
	Addr string
	// AdminAddr is where GET /healthz and GET /metrics are served (-admin,
	// else ADMIN_ADDR, else [DefaultAdminAddr]); the public listener
	// answers them 404. [Serve] refuses an empty one and warns when it is
	// not loopback.
	AdminAddr string
	// RedisURL names the Redis deployment (REDIS_URL): one server, a
	// Cluster or Sentinels, in a form of [ceilingredis.URLForms]. Empty means the
	// in-process memory backend: limits per process.
	RedisURL string
	// DatabaseURL names a PostgreSQL database (DATABASE_URL,
	// postgres://user:password@host:5432/db): limits are counted in its
	// table ceiling_state, which the service creates at start. Setting it
	// and RedisURL is an error.
	DatabaseURL string
	// TrustedProxies are the CIDR prefixes or addresses of the reverse
	// proxies in front of the service (TRUSTED_PROXIES, comma-separated);
	// only their X-Forwarded-For entries are believed.
	TrustedProxies []string
	// KeySecret makes stored keys HMACs (KEY_SECRET, at least
	// 32 bytes), so that nobody who
	// reads Redis can recover a phone number or an address by hashing
	// candidates. Empty means plain SHA-256 digests.
	KeySecret []byte
	// Instances is how many instances of the service run (INSTANCES; 0
	// means not said). With the memory backend and more than one, the
	// health report carries the warning that each enforces its own limits.
	Instances int
	// IPv6Prefix is how many leading bits of an IPv6 client address are one
	// client (IPV6_PREFIX; 0 means ceiling's default, 64). ISPs assign a /56
	// or a /48 to one subscriber, who can otherwise rotate through its /64s.
	IPv6Prefix int
	// RedisPrefix starts every key the service stores in Redis, so that
	// several services (or tests) share one server; empty means the prefix
	// the service passes to [Config.Backend].
	RedisPrefix string

	instancesErr error // a bad INSTANCES, reported by Backend
	prefixErr    error // a bad IPV6_PREFIX, reported by ClientIP
}

// Register adds -addr and -admin to fs and reads the rest of Config from
// getenv (os.Getenv, or a map in tests). Parse fs before using Addr and
// AdminAddr.
func Register(fs *flag.FlagSet, getenv func(string) string) *Config {
	c := &Config{
		RedisURL:    strings.TrimSpace(getenv("REDIS_URL")),
		DatabaseURL: strings.TrimSpace(getenv("DATABASE_URL")),
		KeySecret:   []byte(getenv("KEY_SECRET")),
	}
	if v := getenv("INSTANCES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			c.instancesErr = fmt.Errorf("INSTANCES=%q: want a positive number of instances", v)
		}
		c.Instances = n
	}
	if v := getenv("IPV6_PREFIX"); v != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(v, "/"))
		if err != nil || n < 1 || n > 128 {
			c.prefixErr = fmt.Errorf("IPV6_PREFIX=%q: want a prefix length from 1 to 128, such as 56", v)
		}
		c.IPv6Prefix = n
	}
	addr := getenv("ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	fs.StringVar(&c.Addr, "addr", addr, "listen address (env ADDR)")
	admin := getenv("ADMIN_ADDR")
	if admin == "" {
		admin = DefaultAdminAddr
	}
	fs.StringVar(&c.AdminAddr, "admin", admin, "listen address of GET /healthz and GET /metrics, kept off the public one (env ADMIN_ADDR)")
	for _, p := range strings.Split(getenv("TRUSTED_PROXIES"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			c.TrustedProxies = append(c.TrustedProxies, p)
		}
	}
	return c
}

// ClientIP returns the key function for the client's address: the peer
// address, or with trusted proxies the right-most X-Forwarded-For entry that
// is not one of them (see [ceiling.ClientIP]); IPv6 addresses are grouped by
// IPv6Prefix.
func (c *Config) ClientIP() (ceiling.KeyFunc, error) {
	if c.prefixErr != nil {
		return nil, c.prefixErr
	}
	var opts []ceiling.IPOption
	if c.IPv6Prefix != 0 {
		opts = append(opts, ceiling.IPv6Prefix(c.IPv6Prefix))
	}
	if len(c.TrustedProxies) == 0 {
		return ceiling.ClientIP(opts...)
	}
	k, err := ceiling.ClientIP(append(opts, ceiling.TrustXForwardedFor(c.TrustedProxies...))...)
	if err != nil {
		return nil, fmt.Errorf("TRUSTED_PROXIES=%q: %w", strings.Join(c.TrustedProxies, ","), err)
	}
	return k, nil
}

// minKeySecret is the shortest secret ceiling.WithKeySecret takes: a
// shorter KEY_SECRET is refused here, naming the variable.
const minKeySecret = 32

// Backend returns the limiter options that choose where limits are counted,
// and a function that releases what it opened.
//
// With RedisURL, the options name a Redis store whose keys start with
// RedisPrefix, else prefix, on the client [ceilingredis.URL.Client] makes.
// Without KeySecret, the limiter built with them warns that stored keys
// can be reversed (ceiling warns about every remote backend without a
// secret); Backend does not repeat it.
//
// Without it, the limiter keeps its default in-process memory store, and
// Backend logs a warning that every instance then enforces its own limits:
// three instances admit three times the limit. That is right for a laptop
// and wrong for a deployment, so it must never go unnoticed.
func (c *Config) Backend(logger *slog.Logger, prefix string) ([]ceiling.Option, func() error, error) {
	var opts []ceiling.Option
	if c.instancesErr != nil {
		return nil, nil, c.instancesErr
	}
	if c.Instances > 0 {
		opts = append(opts, ceiling.WithInstances(c.Instances))
	}
	if len(c.KeySecret) > 0 {
		if len(c.KeySecret) < minKeySecret {
			return nil, nil, fmt.Errorf("KEY_SECRET is %d bytes: want at least %d, e.g. from `openssl rand -hex 32`", len(c.KeySecret), minKeySecret)
		}
		opts = append(opts, ceiling.WithKeySecret(c.KeySecret))
	}
	if c.RedisURL != "" && c.DatabaseURL != "" {
		return nil, nil, fmt.Errorf("REDIS_URL and DATABASE_URL are both set: limits are counted in one backend, so set one of them")
	}
	if c.DatabaseURL != "" {
		return c.postgres(logger, prefix, opts)
	}
	if c.RedisURL == "" {
		logger.Warn("REDIS_URL is not set: limits are counted in this process's memory, so EVERY INSTANCE ENFORCES ITS OWN LIMITS "+
			"(n instances admit n times each limit, and a restart forgets them); set REDIS_URL=redis://host:6379/0 to share them",
			slog.String("backend", "memory"))
		return opts, func() error { return nil }, nil
	}
	d, err := ceilingredis.ParseURL(c.RedisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	client := d.Client()
	// Without KEY_SECRET the limiter itself warns, once, that stored keys
	// can be reversed, and keeps the warning in its health report: a
	// second warning here would only repeat it.
	attrs := []any{slog.String("backend", "redis"), slog.String("deployment", d.Kind), slog.String("addrs", strings.Join(d.Addrs, ",")),
		slog.Bool("key_secret", len(c.KeySecret) > 0)}
	if d.Master != "" {
		attrs = append(attrs, slog.String("master", d.Master))
	}
	if d.Kind != "cluster" {
		attrs = append(attrs, slog.Int("db", d.DB))
	}
	logger.Info("limits are shared through Redis", attrs...)
	if c.RedisPrefix != "" {
		prefix = c.RedisPrefix
	}
	// The store logs its failed dials and error replies to the limiter's
	// logger, the service's, sampled: ceiling.New hands it to the store.
	opts = append(opts, ceiling.WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix(prefix))))
	return opts, client.Close, nil
}

// migrateTimeout bounds the creation of the Postgres table at start.
const migrateTimeout = 10 * time.Second

// postgres is Backend's DATABASE_URL: a pool on the database, the table
// and functions created (or updated) there, and a Postgres store.
func (c *Config) postgres(logger *slog.Logger, prefix string, opts []ceiling.Option) ([]ceiling.Option, func() error, error) {
	cfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	if err := ceilingpg.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	logger.Info("limits are shared through Postgres", slog.String("backend", "postgres"),
		slog.String("host", cfg.ConnConfig.Host), slog.Int("port", int(cfg.ConnConfig.Port)),
		slog.String("database", cfg.ConnConfig.Database), slog.Bool("key_secret", len(c.KeySecret) > 0))
	if c.RedisPrefix != "" {
		prefix = c.RedisPrefix
	}
	store := ceilingpg.New(pool, ceilingpg.WithPrefix(prefix))
	return append(opts, ceiling.WithBackend(store)), func() error {
		err := store.Close()
		pool.Close()
		return err
	}, nil
}

// Duration returns the duration in the environment variable name ("250ms",
// "2s"), or def when it is unset.
func Duration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 100ms", name, v)
	}
	return d, nil
}

// Secret returns the value of the environment variable name, or, when it
// is unset, dev after logging a warning that tokens signed with a published
// development secret are accepted.
func Secret(logger *slog.Logger, getenv func(string) string, name, dev string) []byte {
	if v := getenv(name); v != "" {
		return []byte(v)
	}
	logger.Warn(name+" is not set: using the DEVELOPMENT secret, so anybody can sign tokens this service accepts; set "+name+" in any real deployment",
		slog.String("dev_secret", dev))
	return []byte(dev)
}
