package service

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestRegister(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		addr     string
		admin    string
		proxies  []string
		redisURL string
	}{
		{name: "defaults", addr: DefaultAddr, admin: DefaultAdminAddr},
		{name: "ADDR", env: map[string]string{"ADDR": "0.0.0.0:9000"}, addr: "0.0.0.0:9000", admin: DefaultAdminAddr},
		{name: "-addr wins", env: map[string]string{"ADDR": "127.0.0.1:9000"}, args: []string{"-addr", "127.0.0.1:9001"}, addr: "127.0.0.1:9001", admin: DefaultAdminAddr},
		{name: "ADMIN_ADDR", env: map[string]string{"ADMIN_ADDR": "10.0.0.5:9100"}, addr: DefaultAddr, admin: "10.0.0.5:9100"},
		{name: "-admin wins", env: map[string]string{"ADMIN_ADDR": "10.0.0.5:9100"}, args: []string{"-admin", "127.0.0.1:9101"}, addr: DefaultAddr, admin: "127.0.0.1:9101"},
		{name: "proxies and Redis", env: map[string]string{"TRUSTED_PROXIES": " 10.0.0.0/8, ,192.168.1.1 ", "REDIS_URL": " redis://r:6379/2 "},
			addr: DefaultAddr, admin: DefaultAdminAddr, proxies: []string{"10.0.0.0/8", "192.168.1.1"}, redisURL: "redis://r:6379/2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			c := Register(fs, env(tc.env))
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if c.Addr != tc.addr || c.AdminAddr != tc.admin || !slices.Equal(c.TrustedProxies, tc.proxies) || c.RedisURL != tc.redisURL {
				t.Errorf("got addr %q, admin %q, proxies %q, redis %q; want %q, %q, %q, %q", c.Addr, c.AdminAddr, c.TrustedProxies, c.RedisURL, tc.addr, tc.admin, tc.proxies, tc.redisURL)
			}
		})
	}
}

// The admin listener, whose health report says when the limits are off,
// is on loopback unless the operator says otherwise.
func TestAdminAddrIsLoopbackByDefault(t *testing.T) {
	c := Register(flag.NewFlagSet("x", flag.ContinueOnError), env(nil))
	host, _, err := net.SplitHostPort(c.AdminAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Errorf("default admin address %q, want a loopback one", c.AdminAddr)
	}
}

// IPV6_PREFIX groups IPv6 clients as the ISP assigns them: every address of
// one /48 is one key.
func TestIPv6Prefix(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	key, err := Register(fs, env(map[string]string{"IPV6_PREFIX": "/48"})).ClientIP()
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/", nil)
	keys := map[string]bool{}
	for _, a := range []string{"[2001:db8:aa00:1::1]:1", "[2001:db8:aa00:ff00::2]:1", "[2001:db8:aa00:1234:5::3]:1"} {
		r.RemoteAddr = a
		k, err := key(r)
		if err != nil {
			t.Fatal(err)
		}
		keys[k] = true
	}
	if len(keys) != 1 || !keys["2001:db8:aa00::/48"] {
		t.Errorf("keys %v, want one: 2001:db8:aa00::/48", keys)
	}
	for _, v := range []string{"0", "129", "wide"} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		if _, err := Register(fs, env(map[string]string{"IPV6_PREFIX": v})).ClientIP(); err == nil || !strings.Contains(err.Error(), "IPV6_PREFIX") {
			t.Errorf("IPV6_PREFIX=%s: err %v, want one naming IPV6_PREFIX", v, err)
		}
	}
}

func TestClientIPRefusesABadProxy(t *testing.T) {
	c := &Config{TrustedProxies: []string{"10.0.0.0/8", "not-a-cidr"}}
	if _, err := c.ClientIP(); err == nil || !strings.Contains(err.Error(), "TRUSTED_PROXIES") {
		t.Errorf("err %v, want one naming TRUSTED_PROXIES", err)
	}
}

func TestBackendWithoutRedisWarnsLoudly(t *testing.T) {
	var logs bytes.Buffer
	opts, closeFn, err := (&Config{}).Backend(slog.New(slog.NewTextHandler(&logs, nil)), "p")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if len(opts) != 0 {
		t.Errorf("%d options, want none (the limiter's default memory store)", len(opts))
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "EVERY INSTANCE ENFORCES ITS OWN LIMITS") {
		t.Errorf("no loud warning:\n%s", logs.String())
	}
}

func TestInstances(t *testing.T) {
	for _, tc := range []struct {
		v    string
		n    int
		opts int
		ok   bool
	}{{"", 0, 0, true}, {"3", 3, 1, true}, {"0", 0, 0, false}, {"three", 0, 0, false}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		c := Register(fs, env(map[string]string{"INSTANCES": tc.v}))
		opts, _, err := c.Backend(slog.New(slog.DiscardHandler), "p")
		if (err == nil) != tc.ok || (tc.ok && (c.Instances != tc.n || len(opts) != tc.opts)) {
			t.Errorf("INSTANCES=%q: %d instances, %d options, err %v; want %d, %d, ok %v", tc.v, c.Instances, len(opts), err, tc.n, tc.opts, tc.ok)
		}
	}
}

func TestBackendRefusesAShortKeySecret(t *testing.T) {
	_, _, err := (&Config{KeySecret: []byte("too-short-a-secret")}).Backend(slog.New(slog.DiscardHandler), "p")
	if err == nil || !strings.Contains(err.Error(), "KEY_SECRET") {
		t.Errorf("err %v, want one naming KEY_SECRET", err)
	}
}

func TestBackendRefusesABadRedisURL(t *testing.T) {
	_, _, err := (&Config{RedisURL: "http://localhost:6379"}).Backend(slog.New(slog.DiscardHandler), "p")
	if err == nil || !strings.Contains(err.Error(), "REDIS_URL") {
		t.Errorf("err %v, want one naming REDIS_URL", err)
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{{"", time.Second, true}, {"250ms", 250 * time.Millisecond, true}, {"0s", 0, false}, {"-1s", 0, false}, {"fast", 0, false}} {
		got, err := Duration(env(map[string]string{"T": tc.v}), "T", time.Second)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("Duration(%q) = %v, %v; want %v, ok %v", tc.v, got, err, tc.want, tc.ok)
		}
	}
}

func TestSecretWarnsOnTheDevelopmentDefault(t *testing.T) {
	var logs bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&logs, nil))
	if got := string(Secret(lg, env(map[string]string{"S": "real"}), "S", "dev")); got != "real" || logs.Len() != 0 {
		t.Errorf("set: %q, logged %q; want the value, silently", got, logs.String())
	}
	if got := string(Secret(lg, env(nil), "S", "dev")); got != "dev" || !strings.Contains(logs.String(), "S is not set") {
		t.Errorf("unset: %q, logged %q; want the default and a warning", got, logs.String())
	}
}

// A request in flight when the service is told to stop is answered before
// Serve returns.
func TestServeFinishesRequestsInFlight(t *testing.T) {
	logs := &servicetest.LogBuffer{}
	started, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "done")
	})
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	c := &Config{Addr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0"}
	go func() {
		served <- Serve(ctx, c, Handlers{Public: h, Admin: http.NotFoundHandler()}, slog.New(slog.NewTextHandler(logs, nil)))
	}()
	var addr string
	deadline := time.Now().Add(5 * time.Second)
	for addr == "" && time.Now().Before(deadline) {
		if m := regexp.MustCompile(`msg=listening addr=(\S+) admin=`).FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		time.Sleep(5 * time.Millisecond) // polling the log until the real listener is up
	}
	if addr == "" {
		t.Fatalf("no listening line:\n%s", logs.String())
	}
	body := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			body <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body <- string(b)
	}()
	<-started
	stop()
	close(release)
	if got := <-body; got != "done" {
		t.Errorf("the request in flight got %q, want done", got)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// With Redis and no KEY_SECRET the log warns once that stored keys can be
// reversed: the limiter's own warning, not a second one from the service.
// With a secret it does not warn at all.
func TestRedisWithoutKeySecretWarnsOnce(t *testing.T) {
	for _, tc := range []struct {
		secret string
		want   int
	}{{"", 1}, {strings.Repeat("k", 32), 0}} {
		var logs bytes.Buffer
		lg := slog.New(slog.NewTextHandler(&logs, nil))
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		// Nothing dials: the limiter is built, never asked to decide.
		c := Register(fs, env(map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "KEY_SECRET": tc.secret}))
		opts, closeFn, err := c.Backend(lg, "p")
		if err != nil {
			t.Fatal(err)
		}
		l, err := ceiling.New([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Second}},
			append(opts, ceiling.WithLogger(lg))...)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		closeFn()
		if got := strings.Count(logs.String(), "level=WARN"); got != tc.want {
			t.Errorf("KEY_SECRET=%q: %d warnings, want %d:\n%s", tc.secret, got, tc.want, logs.String())
		}
		if tc.want == 1 && !strings.Contains(logs.String(), "SHA-256") {
			t.Errorf("the one warning does not say why:\n%s", logs.String())
		}
	}
}

func TestBackendRefusesRedisAndPostgresTogether(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c := Register(fs, env(map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "DATABASE_URL": "postgres://u:p@127.0.0.1:1/db"}))
	_, _, err := c.Backend(slog.New(slog.DiscardHandler), "p")
	if err == nil || !strings.Contains(err.Error(), "REDIS_URL") || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("err %v, want one naming REDIS_URL and DATABASE_URL", err)
	}
}

// DATABASE_URL selects the Postgres store: the table is created at start,
// the start-up line names the backend, and decisions are stored there.
func TestDatabaseURLSelectsPostgres(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	url := srv.URL("postgres")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c := Register(fs, env(map[string]string{"DATABASE_URL": url, "KEY_SECRET": strings.Repeat("s", 32)}))
	var logs bytes.Buffer
	opts, closeFn, err := c.Backend(slog.New(slog.NewTextHandler(&logs, nil)), "svc")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if !strings.Contains(logs.String(), "backend=postgres") {
		t.Errorf("start-up log %q does not name the Postgres backend", logs.String())
	}
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Hour}},
		append(opts, ceiling.WithLogger(slog.New(slog.DiscardHandler)))...)
	defer l.Close()
	if err := l.Check(context.Background()); err != nil {
		t.Fatalf("Check on the Postgres backend: %v", err)
	}
	pool := pgtest.Pool(t, url)
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM ceiling_state").Scan(&n); err != nil {
		t.Fatalf("the table the service should have created: %v", err)
	}
}
