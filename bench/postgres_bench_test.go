package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresEnv names a PostgreSQL database to measure against (a URL);
// without it the benchmarks start a server of their own through pgtest.
const PostgresEnv = "CEILING_BENCH_POSTGRES"

// postgresURL returns a fresh database to measure on, on a server that
// tracks nested statements in pg_stat_statements and keeps the durability
// defaults a production server has (fsync, synchronous_commit and
// full_page_writes on), where pgtest turns them off for the tests' speed:
// a decision's commit cost is part of what it costs.
func postgresURL(tb testing.TB) string {
	tb.Helper()
	if url := os.Getenv(PostgresEnv); url != "" {
		return url
	}
	return pgtest.Shared(tb, pgtest.Options{Settings: []string{"pg_stat_statements.track=all", "fsync=on", "synchronous_commit=on", "full_page_writes=on"}}).Database(tb)
}

// tripConn counts round trips: a read that follows a write.
type tripConn struct {
	net.Conn
	trips   *atomic.Int64
	written atomic.Bool
}

func (c *tripConn) Write(p []byte) (int, error) {
	c.written.Store(true)
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	if c.written.Swap(false) {
		c.trips.Add(1)
	}
	return c.Conn.Read(p)
}

// pgFixture is one instance's Postgres store on a pool of its own.
type pgFixture struct {
	store *postgres.Store
	pool  *pgxpool.Pool
	trips *atomic.Int64
}

func newPGFixture(tb testing.TB, url string) *pgFixture {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = poolSize
	trips := &atomic.Int64{}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tripConn{Conn: c, trips: trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := postgres.Migrate(context.Background(), pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		tb.Fatal(err)
	}
	s := postgres.New(pool, postgres.WithPrefix(prefix(tb)))
	tb.Cleanup(func() { s.Close() })
	return &pgFixture{store: s, pool: pool, trips: trips}
}

// statements is how many statements the server has run in the fixture's
// database, nested ones included (pg_stat_statements.track = all), less
// the readings themselves, and the time it spent executing the decisions'
// calls, in ms.
func (f *pgFixture) statements(tb testing.TB) (n int64, ms float64) {
	err := f.pool.QueryRow(context.Background(), `SELECT coalesce(sum(calls), 0)::bigint,
		coalesce(sum(total_exec_time) FILTER (WHERE toplevel AND query LIKE '%ceiling_decide%'), 0)
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%'`).Scan(&n, &ms)
	if err != nil {
		tb.Fatal(err)
	}
	return n, ms
}

// clockTicks is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// Linux).
const clockTicks = 100

// serverCPU reads, from /proc, the CPU time in µs that each process of the
// server in pg_stat_activity (every session and the background
// processes, the WAL writer among them) has used, and which of them are
// background processes (their pids negated). It needs the server on this
// machine; for a server elsewhere it returns nil.
func (f *pgFixture) serverCPU(tb testing.TB) map[int]float64 {
	rows, err := f.pool.Query(context.Background(), "SELECT pid, backend_type <> 'client backend' FROM pg_stat_activity")
	if err != nil {
		tb.Fatal(err)
	}
	var pids []int
	for rows.Next() {
		var pid int
		var bg bool
		if err := rows.Scan(&pid, &bg); err != nil {
			tb.Fatal(err)
		}
		if bg {
			pid = -pid
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	cpu := make(map[int]float64, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(max(pid, -pid)) + "/stat")
		if err != nil {
			if len(cpu) == 0 {
				return nil // not this machine's server
			}
			continue // a process that ended meanwhile
		}
		// utime and stime are the 14th and 15th fields; the second, the
		// command, is parenthesized and may hold spaces
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(fields[11], 64)
		k, _ := strconv.ParseFloat(fields[12], 64)
		cpu[pid] = (u + k) * 1e6 / clockTicks
	}
	return cpu
}

// cpuSince is the server CPU used from reading before to reading after, in
// all and by the background processes: a process in both readings by its
// difference, one that started meanwhile whole.
func cpuSince(before, after map[int]float64) (all, bg float64) {
	for pid, t := range after {
		d := t - before[pid]
		all += d
		if pid < 0 {
			bg += d
		}
	}
	return all, bg
}

// BenchmarkPostgres is one decision of ceiling's Postgres store, one rule
// and three rules on one request, over 10,000 keys: latency serial, and
// throughput from 64 goroutines, beside ceiling's Redis store
// (ceiling-store) in the same run, and the floors of a decision on
// Postgres (pgFloors). Every timed decision must be admitted.
// For Postgres it reports the round trips per decision (trips/op, counted
// on the connections) and the statements the server ran per decision
// (stmts/op: the call and those inside the function, from
// pg_stat_statements) and the server's execution time per decision
// (srv-µs/op, the call's total_exec_time, a wall-clock figure that a
// descheduled server inflates), and the CPU time every process of the
// server used per decision (srv-cpu-µs/op, from /proc, 10 ms resolution),
// of it the background processes' (bg-cpu-µs/op: the WAL writer flushing
// the asynchronous commits, the checkpointer), which sizes the database.
func BenchmarkPostgres(top *testing.B) {
	url := postgresURL(top)
	addr := redisAddr(top)
	var store redisLib
	for _, lib := range redisLibs {
		if lib.name == "ceiling-store" {
			store = lib
		}
	}
	ks := keys(redisKeys)
	for _, fl := range pgFloors {
		top.Run("floor="+fl.name+"/serial/postgres", func(b *testing.B) {
			f := setup(b, top, func() *pgFixture { return newPGFixture(top, url) })
			pgFloor(b, f, fl.sql, ks)
		})
	}
	for _, n := range []int{1, 3} {
		for _, mode := range []string{"serial", "parallel64"} {
			top.Run(fmt.Sprintf("rules=%d/%s/redis", n, mode), func(b *testing.B) {
				f := setup(b, top, func() *redisFixture { return newRedisFixture(top, store, addr, n) })
				if mode == "serial" {
					redisSerial(b, f, ks)
				} else {
					redisParallel(b, f, ks)
				}
			})
			top.Run(fmt.Sprintf("rules=%d/%s/postgres", n, mode), func(b *testing.B) {
				f := setup(b, top, func() *pgFixture { return newPGFixture(top, url) })
				pgMeasure(b, f, n, mode == "parallel64", ks)
			})
		}
	}
}

// pgFloors are what a decision costs at least, timed on the same kind of
// pool over the same keys: a round trip (select1), and a bare one-row
// upsert committed asynchronously as a decision is (upsert): a lock, a
// write and a commit with no decision around them.
var pgFloors = []struct{ name, sql string }{
	{"select1", "SELECT 1 WHERE $1::text IS NOT NULL"},
	{"upsert", `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
		INSERT INTO bench_floor AS t (key, n) SELECT $1, 1 FROM c
		ON CONFLICT (key) DO UPDATE SET n = t.n + 1 RETURNING 1`},
}

// pgFloor times b.N runs of the floor statement sql on f, one key each,
// serially, and reports round trips and statements per run as pgMeasure
// does.
func pgFloor(b *testing.B, f *pgFixture, sql string, ks []string) {
	if _, err := f.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor (key text COLLATE "C" PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	stmts0, ms0 := f.statements(b)
	cpu0 := f.serverCPU(b)
	trips0 := f.trips.Load()
	b.ReportAllocs()
	b.ResetTimer()
	var one int
	for i := range b.N {
		if err := f.pool.QueryRow(ctx, sql, ks[i%len(ks)]).Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	f.report(b, stmts0, ms0, cpu0, trips0)
}

// pgMeasure times b.N decisions of n huge rules on f, serially or from 64
// goroutines, and reports round trips and statements per decision.
func pgMeasure(b *testing.B, f *pgFixture, n int, parallel bool, ks []string) {
	rules := hugeRules(n)
	newReqs := func() []backend.Request {
		reqs := make([]backend.Request, n)
		for i, r := range rules {
			reqs[i] = backend.Request{Limit: int64(r.limit), Period: r.period, Cost: 1}
		}
		return reqs
	}
	var rejected, errs atomic.Int64
	decide := func(reqs []backend.Request, out []backend.Result, key string) {
		for i := range reqs {
			reqs[i].Key = key + ruleSuffix[i]
		}
		if err := f.store.DecideInto(ctx, reqs, out); err != nil {
			errs.Add(1)
			return
		}
		for _, r := range out[:len(reqs)] {
			if !r.Allowed {
				rejected.Add(1)
				return
			}
		}
	}
	stmts0, ms0 := f.statements(b)
	cpu0 := f.serverCPU(b)
	trips0 := f.trips.Load()
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	if !parallel {
		reqs, out := newReqs(), make([]backend.Result, n)
		for i := range b.N {
			decide(reqs, out, ks[i%len(ks)])
		}
	} else {
		b.SetParallelism((goroutines + 1) / 2)
		var start atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			reqs, out := newReqs(), make([]backend.Result, n)
			i := int(start.Add(7919)) % len(ks)
			for pb.Next() {
				decide(reqs, out, ks[i])
				if i++; i == len(ks) {
					i = 0
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "decisions/s")
	}
	b.StopTimer()
	verdict(b, int(rejected.Load()), int(errs.Load()))
	f.report(b, stmts0, ms0, cpu0, trips0)
}

// report reports the round trips, statements, decision functions' server
// time and server CPU per operation since the readings taken before the
// timed loop.
func (f *pgFixture) report(b *testing.B, stmts0 int64, ms0 float64, cpu0 map[int]float64, trips0 int64) {
	cpu1 := f.serverCPU(b)
	trips := f.trips.Load() - trips0
	stmts, ms := f.statements(b)
	stmts -= stmts0
	b.ReportMetric(float64(trips)/float64(b.N), "trips/op")
	b.ReportMetric(float64(stmts)/float64(b.N), "stmts/op")
	if ms > ms0 { // a floor calls no decision function
		b.ReportMetric((ms-ms0)*1000/float64(b.N), "srv-µs/op")
	}
	if cpu0 != nil && cpu1 != nil {
		all, bg := cpuSince(cpu0, cpu1)
		b.ReportMetric(all/float64(b.N), "srv-cpu-µs/op")
		b.ReportMetric(bg/float64(b.N), "bg-cpu-µs/op")
	}
}

// BenchmarkPostgresExact is the exactness experiment on Postgres: limit
// 100 per minute, 1000 concurrent decisions on one key from 4 instances
// (each its own pool and store) on one database; exactly 100 is correct.
// Run it with -benchtime=1x: every iteration is a fresh key.
func BenchmarkPostgresExact(b *testing.B) {
	url := postgresURL(b)
	fs := make([]*pgFixture, exactInstances)
	for i := range fs {
		fs[i] = newPGFixture(b, url)
		fs[i].store = postgres.New(fs[i].pool, postgres.WithPrefix("exact"))
	}
	var admitted, rejected, failed int64
	runs := 0
	for b.Loop() {
		req := backend.Request{Key: "k" + itoa(runs), Limit: exactLimit, Period: time.Minute, Cost: 1}
		var a, r, e atomic.Int64
		var wg sync.WaitGroup
		for i := range exactCalls {
			s := fs[i%len(fs)].store
			wg.Go(func() {
				res, err := s.Decide(ctx, []backend.Request{req})
				switch {
				case err != nil:
					e.Add(1)
				case res[0].Allowed:
					a.Add(1)
				default:
					r.Add(1)
				}
			})
		}
		wg.Wait()
		admitted, rejected, failed = admitted+a.Load(), rejected+r.Load(), failed+e.Load()
		runs++
	}
	n := float64(runs)
	b.ReportMetric(float64(admitted)/n, "admitted")
	b.ReportMetric(float64(rejected)/n, "rejected")
	b.ReportMetric(float64(failed)/n, "errors")
	if admitted != int64(runs*exactLimit) {
		b.Fatalf("admitted %d in %d runs, want exactly %d per run", admitted, runs, exactLimit)
	}
}
