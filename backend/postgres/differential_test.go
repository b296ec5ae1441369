package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/internal/model"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sequences numbers the key spaces of the differential targets, which
// share one database.
var sequences atomic.Int64

// differential is the model-based test of a Store on pool, comparing the
// row of every key a step names with the model's state.
func differential(pool *pgxpool.Pool) backendtest.Differential {
	return backendtest.Differential{
		Paste: "differential(migrated(t))",
		New: func(t testing.TB, now func() time.Time) backendtest.Target {
			prefix := fmt.Sprintf("d%d", sequences.Add(1))
			s := New(pool, WithPrefix(prefix), WithClock(now), WithJanitor(0, 0))
			return backendtest.Target{Backend: s, Inspect: func(key string, want model.State, ok, _ bool) error {
				return inspect(pool, prefix+":"+key, want, ok)
			}}
		},
	}
}

// TestDifferential compares the Store with the reference model on random
// sequences (see backend/backendtest/README.md for the knobs).
func TestDifferential(t *testing.T) {
	d := differential(migrated(t))
	d.Sequences = 300
	d.Run(t)
}

// TestConcurrentMatchesReplay races 8 goroutines on shared keys: every key
// then holds exactly the replay of the admitted calls, and none admitted
// more than its limit.
func TestConcurrentMatchesReplay(t *testing.T) {
	differential(migrated(t)).Concurrent(t, 8, 10, 40)
}

// inspect compares the row stored under key with the model's state: no
// row once back to full, otherwise the algorithm, its state's values in
// the layout of algorithms.sql, and the instant it is back to full.
func inspect(pool *pgxpool.Pool, key string, want model.State, ok bool) error {
	var alg int16
	var st []int64
	var exp int64
	err := pool.QueryRow(context.Background(), "SELECT alg, st, expires FROM ceiling_state WHERE key = $1", key).Scan(&alg, &st, &exp)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && !ok:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("no row stored, the model holds %+v", want)
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("row %d %v (expires %d) stored, the model holds none", alg, st, exp)
	}
	var w []int64
	switch want.Algorithm {
	case backend.GCRA:
		w = []int64{want.TAT, want.Written, want.T}
	case backend.FixedWindow:
		w = []int64{want.Start, want.Count}
	case backend.SlidingWindow:
		w = []int64{want.Start, want.Prev, want.Cur}
	case backend.SlidingLog:
		for _, r := range want.Log {
			w = append(w, r.T, r.N)
		}
	case backend.RollingWindow:
		w = append([]int64{want.W, want.Last}, want.Buckets...)
	case backend.Concurrency:
		w = []int64{want.Written}
		for _, l := range want.Leases {
			w = append(w, l.ID, l.N, l.Exp)
		}
	}
	if int(alg) != int(want.Algorithm) || !slices.Equal(st, w) || exp != want.Expires {
		return fmt.Errorf("row %d %v expiring at %d, the model holds %d %v expiring at %d", alg, st, exp, want.Algorithm, w, want.Expires)
	}
	return nil
}
