package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/postgres/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSearchPathCannotHijackTheFunctions_Attack: a session whose
// search_path puts another schema before ceiling's, holding a table
// ceiling_state and step functions of the same signatures, and a
// temporary table ceiling_state (searched first for tables when pg_temp
// is not named), decides on ceiling's own table with ceiling's own
// functions: the hijacking functions raise if called, and the impostor
// tables stay empty.
func TestSearchPathCannotHijackTheFunctions_Attack(t *testing.T) {
	url := pgtest.Shared(t).Database(t)
	ctx := context.Background()
	owner := pgtest.Pool(t, url)
	if err := Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}
	const table = "(key text PRIMARY KEY, alg smallint NOT NULL, st bigint[] NOT NULL, expires bigint NOT NULL)"
	evil := "CREATE SCHEMA evil; CREATE TABLE evil.ceiling_state " + table + ";"
	for _, f := range []string{"ceiling_fixed(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint",
		"ceiling_rolling(s bigint[], now bigint, lim bigint, p bigint, c bigint, force boolean, stamp bigint"} {
		evil += "CREATE FUNCTION evil." + f + `, OUT ok boolean, OUT remaining bigint, OUT reset bigint, OUT retry bigint,
			OUT nxt bigint, OUT placed bigint, OUT st bigint[], OUT exp bigint) LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'hijacked'; END $$;`
	}
	if _, err := owner.Exec(ctx, evil); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = "evil, public"
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "CREATE TEMP TABLE ceiling_state "+table)
			return err
		}
	})
	s := New(pool, WithJanitor(0, 0), WithPrefix(""))
	defer s.Close()
	one := backend.Request{Key: "one", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1}
	two := []backend.Request{
		{Key: "a", Algorithm: backend.FixedWindow, Limit: 1, Period: time.Hour, Cost: 1},
		{Key: "b", Algorithm: backend.RollingWindow, Limit: 1, Period: time.Hour, Cost: 1},
	}
	for i, want := range []bool{true, false} {
		for _, call := range [][]backend.Request{{one}, two} {
			res, err := s.Decide(ctx, call)
			if err != nil {
				t.Fatalf("decision %d of %d requests under search_path evil, public: %v", i, len(call), err)
			}
			if res[0].Allowed != want {
				t.Fatalf("decision %d of %d requests: allowed %v, want %v (limit 1)", i, len(call), res[0].Allowed, want)
			}
		}
	}
	var impostors, real int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_temp.ceiling_state) + (SELECT count(*) FROM evil.ceiling_state)").Scan(&impostors); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM public.ceiling_state").Scan(&real); err != nil {
		t.Fatal(err)
	}
	if impostors != 0 || real != 3 {
		t.Fatalf("%d rows in the impostor tables and %d in ceiling's, want 0 and 3", impostors, real)
	}
}
