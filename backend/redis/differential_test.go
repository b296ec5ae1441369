package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/internal/model"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// differential is the model-based test of a Store on client, inspecting the
// value and TTL of every key a step names. denySize is WithDenyCache's.
func differential(client redis.UniversalClient, denySize int, keys ...string) backendtest.Differential {
	return backendtest.Differential{
		Keys:      keys,
		DenyCache: denySize > 0,
		Split: func(reqs []backend.Request) bool { // the hash tags of clusterKeys name the slots
			for _, r := range reqs {
				if len(keys) > 0 && slot(r.Key) != slot(reqs[0].Key) {
					return true
				}
			}
			return false
		},
		New: func(t testing.TB, now func() time.Time) backendtest.Target {
			prefix := redistest.KeyPrefix(t)
			s := New(client, WithPrefix(prefix), WithClock(now), WithDenyCache(denySize))
			return backendtest.Target{Backend: s, Inspect: func(key string, want model.State, ok, written bool) error {
				// On Cluster a call rejected on another slot is undone by
				// its inverse, which leaves a state equivalent to the model's
				// (see equivalent), not necessarily the same bytes.
				undone := len(keys) > 0 && !written
				return inspect(client, prefix+":"+key, want, ok, written, undone, now().UnixMicro())
			}}
		},
	}
}

// Keys of two Redis Cluster hash slots, so that calls span slots.
var clusterKeys = []string{"{x}a", "{x}b", "{y}c", "{y}d"}

// Differential targets: miniredis runs hermetically (fewer sequences: it is
// slow under the race detector), then the real server, the cluster, and the
// real server behind the deny cache.
func singleDifferential(t testing.TB) backendtest.Differential {
	return differential(redistest.Shared(t).Client(t), 0)
}

func clusterDifferential(t testing.TB) backendtest.Differential {
	return differential(redistest.SharedCluster(t).Client(t), 0, clusterKeys...)
}

func denyDifferential(t testing.TB) backendtest.Differential {
	return differential(redistest.Shared(t).Client(t), DefaultDenyCacheSize)
}

func clusterDenyDifferential(t testing.TB) backendtest.Differential {
	return differential(redistest.SharedCluster(t).Client(t), DefaultDenyCacheSize, clusterKeys...)
}

// TestDifferential compares the Store with the reference model on random
// sequences (see backend/backendtest/README.md for the knobs).
func TestDifferential(t *testing.T) {
	if slot("{x}") == slot("{y}") {
		t.Fatal("the cluster keys share a slot")
	}
	for _, c := range []struct {
		name      string
		d         func(testing.TB) backendtest.Differential
		sequences int
	}{
		{"miniredis", func(t testing.TB) backendtest.Differential {
			return differential(targets[0].client(t), 0)
		}, 100},
		{"redis", singleDifferential, 1000},
		{"cluster", clusterDifferential, 600},
		{"redis+deny", denyDifferential, 600},
		{"cluster+deny", clusterDenyDifferential, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.d(t)
			d.Sequences = c.sequences
			d.Paste = map[string]string{
				"miniredis": "differential(targets[0].client(t), 0)", "redis": "singleDifferential(t)",
				"cluster": "clusterDifferential(t)", "redis+deny": "denyDifferential(t)", "cluster+deny": "clusterDenyDifferential(t)",
			}[c.name]
			d.Run(t)
		})
	}
}

// inspect compares the value and TTL stored under key with the model's
// state: the layout the script writes ("R2 w last S n16..n0", "tat at T",
// "f start count", "w start prev cur", the sliding log's of parseLog, a
// Concurrency key's sorted set and hash of leases), no key once back to
// full, and a
// TTL of the time the state takes to be full again (at least
// fakeClockMinTTL, as the Store runs under WithClock).
func inspect(client redis.UniversalClient, key string, want model.State, ok, written, undone bool, now int64) error {
	ctx := context.Background()
	if typ := client.Type(ctx, key).Val(); typ == "zset" || want.Algorithm == backend.Concurrency && ok {
		return inspectLeases(client, key, want, undone, now)
	}
	raw, err := client.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil) && (!ok || undone && want.Expires <= now):
		return nil
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("no value stored, the model holds %+v", want)
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("stored %q for a key the model holds nothing for", raw)
	}
	got, err := parseState(raw)
	if err != nil {
		return err
	}
	if !stateEqual(got, want) && !(undone && equivalent(got, want, now)) {
		return fmt.Errorf("stored %q, want %+v", raw, want)
	}
	ttl, err := client.PTTL(ctx, key).Result()
	if err != nil {
		return err
	}
	wantTTL := max(want.TTL(), fakeClockMinTTL*time.Millisecond)
	if undone {
		return nil // the inverse's write sets the TTL of the state it leaves
	}
	if ttl > wantTTL || ttl <= 0 || (written && ttl < wantTTL-10*time.Second) {
		return fmt.Errorf("TTL %v, want %v (the state is full again in %v)", ttl, wantTTL, want.TTL())
	}
	return nil
}

// inspectLeases compares a Concurrency key, a sorted set of lease ids
// scored by expiry plus an offset, beside a hash (in the same slot) of id
// -> units, '#' -> their sum, '@' -> the last write's now and '+' -> the
// offset, with the model's leases, whatever their order, and checks that
// both keys expire when the last lease does.
func inspectLeases(client redis.UniversalClient, key string, want model.State, undone bool, now int64) error {
	ctx := context.Background()
	hkey := companion(key)
	zs, err := client.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		return err
	}
	units, err := client.HGetAll(ctx, hkey).Result()
	if err != nil {
		return err
	}
	var got []model.Lease
	sum := int64(0)
	off, _ := strconv.ParseInt(units["+"], 10, 64)
	for _, z := range zs {
		id, _ := strconv.ParseInt(z.Member.(string), 10, 64)
		n, _ := strconv.ParseInt(units[z.Member.(string)], 10, 64)
		got = append(got, model.Lease{ID: id, N: n, Exp: int64(z.Score) - off})
		sum += n
	}
	byID := func(a, b model.Lease) int { return int(a.ID - b.ID) }
	wantLeases := slices.SortedFunc(slices.Values(want.Leases), byID)
	if undone { // only the live leases count
		expired := func(l model.Lease) bool { return l.Exp <= now }
		wantLeases, got = slices.DeleteFunc(wantLeases, expired), slices.DeleteFunc(got, expired)
	}
	slices.SortFunc(got, byID)
	if !slices.Equal(got, wantLeases) || units["#"] != strconv.FormatInt(sum, 10) || len(units) != len(zs)+3 {
		return fmt.Errorf("stored leases %+v and units %v, want %+v", got, units, wantLeases)
	}
	wantTTL := max(want.TTL(), fakeClockMinTTL*time.Millisecond)
	for _, k := range []string{key, hkey} {
		if undone || len(got) == 0 {
			break
		}
		if ttl := client.PTTL(ctx, k).Val(); ttl > wantTTL || ttl <= 0 {
			return fmt.Errorf("%s: TTL %v, want %v", k, ttl, wantTTL)
		}
	}
	return nil
}

// equivalent reports whether got, stored after the inverse of a call that
// the model rejected, reads as want at now: the same units counting, with
// expired ones dropped and a rolling window shifted to a later bucket.
func equivalent(got, want model.State, now int64) bool {
	if got.Algorithm != want.Algorithm {
		return false
	}
	switch got.Algorithm {
	case backend.GCRA:
		return got.TAT == want.TAT && got.T == want.T || got.TAT <= now && want.TAT <= now
	case backend.RollingWindow:
		d := got.Last - want.Last
		if got.W != want.W || d < 0 {
			return false
		}
		for i := range got.Buckets {
			w := int64(0)
			if j := int64(i) + d; j < int64(len(want.Buckets)) {
				w = want.Buckets[j]
			}
			if got.Buckets[i] != w {
				return false
			}
		}
		return true
	case backend.SlidingLog:
		return len(got.Log) <= len(want.Log) && slices.Equal(got.Log, want.Log[len(want.Log)-len(got.Log):])
	case backend.FixedWindow:
		return got.Start == want.Start && got.Count == want.Count || got.Start > want.Start && got.Count == 0
	case backend.SlidingWindow:
		return got.Start == want.Start && got.Prev == want.Prev && got.Cur == want.Cur ||
			got.Start > want.Start && got.Cur == 0 && got.Prev <= want.Cur
	}
	return false
}

func stateEqual(a, b model.State) bool {
	return a.Algorithm == b.Algorithm && a.TAT == b.TAT && a.T == b.T && a.Start == b.Start && a.Count == b.Count &&
		a.Prev == b.Prev && a.Cur == b.Cur && slices.Equal(a.Log, b.Log) &&
		a.W == b.W && a.Last == b.Last && slices.Equal(a.Buckets, b.Buckets) && slices.Equal(a.Leases, b.Leases)
}

// parseState reads a stored value back into the model's terms.
func parseState(raw string) (model.State, error) {
	if strings.HasPrefix(raw, "L2 ") {
		return parseLog(raw)
	}
	f := strings.Fields(raw)
	nums := make([]int64, len(f))
	for i := 1; i < len(f); i++ {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return model.State{}, fmt.Errorf("stored %q: field %d: %v", raw, i, err)
		}
		nums[i] = n
	}
	bad := fmt.Errorf("stored %q: not a layout the script writes", raw)
	switch {
	case len(f) == 3 && f[0] != "f" && nums[1] > 0 && nums[2] > 0:
		tat, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || tat <= 0 {
			return model.State{}, bad
		}
		return model.State{Algorithm: backend.GCRA, TAT: tat, T: nums[2]}, nil // "tat at T"

	case len(f) == 3 && f[0] == "f":
		return model.State{Algorithm: backend.FixedWindow, Start: nums[1], Count: nums[2]}, nil
	case len(f) == 21 && f[0] == "R2" && len(raw) == 51+17*11:
		// "R2 W last S " then 17 counts, fixed-width, the current bucket's
		// first (ALGORITHMS.md).
		sum := int64(0)
		for _, n := range nums[4:] {
			sum += n
		}
		if want := fmt.Sprintf("R2 %015d %015d %015d ", nums[1], nums[2], nums[3]); raw[:51] != want || sum != nums[3] {
			return model.State{}, fmt.Errorf("stored %q: header %q, counts summing to %d: not the rolling window layout", raw, raw[:51], sum)
		}
		buckets := make([]int64, 17)
		for i := range 17 {
			if c := raw[51+11*i : 51+11*i+11]; c != fmt.Sprintf("%010d ", nums[4+i]) {
				return model.State{}, fmt.Errorf("stored %q: count %d is %q: not the rolling window layout", raw, i, c)
			}
			buckets[16-i] = nums[4+i]
		}
		return model.State{Algorithm: backend.RollingWindow, W: nums[1], Last: nums[2], Buckets: buckets}, nil
	case len(f) == 4 && f[0] == "w":
		return model.State{Algorithm: backend.SlidingWindow, Start: nums[1], Prev: nums[2], Cur: nums[3]}, nil
	}
	return model.State{}, bad
}

// parseLog reads a sliding log in the layout of ALGORITHMS.md: the header
// "L2 k newest head fin" (zero-padded to 59 bytes), then 34-byte records
// "t n", the live ones in bytes [head, fin), oldest first; bytes before
// head are expired records, bytes after fin records taken back.
func parseLog(raw string) (model.State, error) {
	const header, record = 59, 34
	bad := func(why string) (model.State, error) {
		return model.State{}, fmt.Errorf("stored %q: not the sliding log layout: %s", raw, why)
	}
	var k, newest, head, fin int64
	if len(raw) < header || raw[header-1] != '\n' {
		return bad("short header")
	}
	if n, err := fmt.Sscanf(raw[:header], "L2 %016d %016d %010d %010d\n", &k, &newest, &head, &fin); n != 4 || err != nil {
		return bad(fmt.Sprint("header: ", err))
	}
	if head < header || fin < head || fin > int64(len(raw)) || (fin-head)%record != 0 || (head-header)%record != 0 || head == fin {
		return bad(fmt.Sprintf("live records at [%d, %d) of %d bytes", head, fin, len(raw)))
	}
	s := model.State{Algorithm: backend.SlidingLog}
	sum := int64(0)
	for o := head; o < fin; o += record {
		var t, n int64
		if c, err := fmt.Sscanf(raw[o:o+record], "%016d %016d\n", &t, &n); c != 2 || err != nil || raw[o+record-1] != '\n' {
			return bad(fmt.Sprintf("record at %d: %v", o, err))
		}
		if n == 0 {
			continue // a record a stamped refund emptied
		}
		if n < 0 || (len(s.Log) > 0 && t < s.Log[len(s.Log)-1].T) {
			return bad(fmt.Sprintf("record at %d: %d units at %d", o, n, t))
		}
		sum += n
		s.Log = mergeRun(s.Log, model.Run{T: t, N: n})
	}
	if sum != k || s.Log[len(s.Log)-1].T != newest {
		return bad(fmt.Sprintf("the header says %d units, newest at %d; the records hold %d", k, newest, sum))
	}
	return s, nil
}

// mergeRun appends r to log, merging it into the last run at the same
// instant (the script may write the units of one instant as two records).
func mergeRun(log []model.Run, r model.Run) []model.Run {
	if n := len(log); n > 0 && log[n-1].T == r.T {
		log[n-1].N += r.N
		return log
	}
	return append(log, r)
}

// TestConcurrentMatchesReplay races 8 goroutines on shared keys of the
// single server and of the cluster (calls spanning both slots, some of
// them rejected and undone while other goroutines write the same keys):
// afterwards every key holds exactly the replay of the admitted calls, and
// none admitted more than its limit.
func TestConcurrentMatchesReplay(t *testing.T) {
	t.Run("redis", func(t *testing.T) { singleDifferential(t).Concurrent(t, 8, 10, 40) })
	t.Run("cluster", func(t *testing.T) { clusterDifferential(t).Concurrent(t, 8, 30, 40) })
}
