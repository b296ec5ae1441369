package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// logHeader and logRecord are the sliding log's stored layout
// (ALGORITHMS.md), written out independently of the script.
func logHeader(k, newest, head, fin int64) string {
	return fmt.Sprintf("L2 %016d %016d %010d %010d\n", k, newest, head, fin)
}

func logRecord(t, n int64) string { return fmt.Sprintf("%016d %016d\n", t, n) }

// A sliding log is stored as a header and fixed-width records, so that the
// script reads and writes a record at a time. This pins the layout through
// its life: admissions append (units of one instant join its record),
// expired records are skipped by moving head and dropped once they outweigh
// the live ones, a refund moves fin back; a value of another layout counts
// as absent. (The conformance suite would pass
// with any layout; the differential test parses this one after every step.)
func TestSlidingLogLayout(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		for _, script := range []string{"batch.lua", "decide.lua"} {
			t.Run(script, func(t *testing.T) {
				ctx := context.Background()
				clock := newFakeClock()
				s := New(client, WithPrefix(prefix+script), WithClock(clock.Now), WithDenyCache(0))
				call := func(r backend.Request) []backend.Result {
					t.Helper()
					if script == "decide.lua" {
						return decide(t, s, r, backend.Request{Key: "{x}other", Algorithm: backend.FixedWindow, Limit: 4, Period: time.Second})[:1]
					}
					return decide(t, s, r)
				}
				r := backend.Request{Key: "{x}otp:to:x", Algorithm: backend.SlidingLog, Limit: 5, Period: time.Minute, Cost: 1}
				key := prefix + script + ":" + r.Key
				t0 := clock.Now().UnixMicro()
				stored := func(label, want string) {
					t.Helper()
					got, err := client.Get(ctx, key).Result()
					if err != nil {
						t.Fatalf("%s: %v", label, err)
					}
					if got != want {
						t.Errorf("%s: stored\n%q, want\n%q", label, got, want)
					}
				}
				const H, R = 59, 34

				call(r)
				call(r) // the same instant: one record of 2
				clock.Advance(time.Second)
				call(r)
				t1 := t0 + time.Second.Microseconds()
				stored("three admissions", logHeader(3, t1, H, H+2*R)+logRecord(t0, 2)+logRecord(t1, 1))

				// A refund takes the newest units back: fin moves back a record,
				// then t0's record keeps 1 of its 2; the bytes after fin stay while
				// they do not outweigh the live ones.
				r.Cost = -1
				call(r)
				stored("after a refund of 1", logHeader(2, t0, H, H+R)+logRecord(t0, 2)+logRecord(t1, 1))
				call(r)
				stored("after a second refund of 1", logHeader(1, t0, H, H+R)+logRecord(t0, 1)+logRecord(t1, 1))

				// When they do, the log is rewritten: three records, two taken back.
				other := r
				other.Key += ":refund"
				other.Cost = 1
				for range 3 {
					clock.Advance(time.Millisecond)
					call(other)
				}
				tb := clock.Now().UnixMicro() - 2000
				other.Cost = -2
				call(other)
				got, _ := client.Get(ctx, prefix+script+":"+other.Key).Result()
				if want := logHeader(1, tb, H, H+R) + logRecord(tb, 1); got != want {
					t.Errorf("three records, two taken back: stored\n%q, want\n%q", got, want)
				}

				// Past t0's expiry the next admission skips the expired record
				// (head moves) and writes at fin.
				r.Cost = 1
				clock.Advance(time.Minute)
				t2 := clock.Now().UnixMicro()
				call(r)
				stored("t0 expired", logHeader(1, t2, H+R, H+2*R)+logRecord(t0, 1)+logRecord(t2, 1))

				// Once the expired records outweigh the live ones, the log is
				// rewritten without them.
				clock.Advance(time.Minute)
				t3 := clock.Now().UnixMicro()
				call(r)
				stored("t2 expired: rewritten", logHeader(1, t3, H, H+R)+logRecord(t3, 1))

				// A value of any other layout (an earlier one, which no release
				// wrote) counts as absent.
				clock.Advance(time.Hour)
				t5 := clock.Now().UnixMicro()
				old := "L 3 " + itoa(t5) + " " + itoa(t5-1000) + " 1 " + itoa(t5) + " 2"
				if err := client.Set(ctx, key, old, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				r.Cost = 3
				if res := call(r)[0]; !res.Allowed || res.Remaining != 2 {
					t.Errorf("cost 3 on an earlier layout's log of 3 units: %+v, want admitted with 2 remaining (absent state)", res)
				}
				stored("the earlier layout replaced", logHeader(3, t5, H, H+R)+logRecord(t5, 3))

				// The oldest layout counts as absent.
				if err := client.Set(ctx, key, "l "+itoa(t5)+" 5", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				r.Cost = 1
				if res := call(r)[0]; !res.Allowed || res.Remaining != 4 {
					t.Errorf("after an oldest-layout value: %+v, want admitted with 4 remaining (absent state)", res)
				}
				stored("the oldest layout replaced", logHeader(1, t5, H, H+R)+logRecord(t5, 1))
			})
		}
	})
}

// A steady sliding log of 1000 units admits with a few reads of its header
// and records, never the whole log: no GET or MGET, and the log's stored size
// stays within twice its live records (the dead are dropped).
func TestSlidingLogAdmissionReadsRecordsNotTheLog(t *testing.T) {
	srv := redistest.Server(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	clock := newFakeClock()
	s := New(client, WithClock(clock.Now), WithDenyCache(0))
	const live = 1000
	r := backend.Request{Key: "log", Algorithm: backend.SlidingLog, Limit: 2 * live, Period: live * time.Millisecond, Cost: 1}
	for range 3 * live {
		clock.Advance(time.Millisecond)
		if res := decide(t, s, r)[0]; !res.Allowed {
			t.Fatalf("refused %+v", res)
		}
	}
	before := commandCalls(t, client)
	const n = 200
	for range n {
		clock.Advance(time.Millisecond)
		decide(t, s, r)
		size, err := client.StrLen(ctx, "ceiling:log").Result()
		if err != nil {
			t.Fatal(err)
		}
		if size > 59+2*(live+1)*34 {
			t.Fatalf("a log of %d live units stored in %d bytes", live, size)
		}
	}
	after := commandCalls(t, client)
	if got := after["get"] + after["mget"] - before["get"] - before["mget"]; got != 0 {
		t.Errorf("%d GETs or MGETs in %d admissions: the whole log was read", got, n)
	}
	// Per admission: the header and the expired record (GETRANGE), the
	// record and header written (SETRANGE), the TTL (PEXPIRE); a rewrite
	// (GETRANGE of the live records, SET) once per `live` admissions.
	if got := after["getrange"] - before["getrange"]; got > 3*n {
		t.Errorf("%d GETRANGEs in %d admissions, want at most 3 each", got, n)
	}
	if got := after["strlen"] - before["strlen"]; got < n {
		t.Errorf("%d STRLEN for this test's %d: commandstats miscounted", got, n)
	}
}

// commandCalls reads INFO commandstats into calls per command.
func commandCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("INFO commandstats line %q: %v", line, err)
				}
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
