package redis

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkRedis compares one decision with a bare PING through the same
// client on a local redis-server, serially and from 64 goroutines: the
// decision's cost over a PING is what the script and the encoding add to
// the round trip. Two floors show what any script-based limiter pays: an
// EVALSHA that does nothing, and one that reads TIME, GETs and SETs a key.
// "rolling=script" is the Store's own script for a lone rolling-window
// request sent alone, beside "rolling=store", the same request through
// Decide: what the Store's Go adds to its script. "denied" is a request the
// deny cache answers without Redis. Run with
//
//	go test ./backend/redis -run '^$' -bench Redis -benchtime 2s
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Shared(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(b)
	s := New(client, WithPrefix(prefix))
	ctx := context.Background()
	// Limits no benchmark can reach, so every decision admits and writes.
	one := []backend.Request{
		{Key: "minute:u", Algorithm: backend.GCRA, Limit: backend.MaxLimit, Period: time.Minute, Cost: 1},
	}
	three := append(one[:1:1],
		backend.Request{Key: "day:u", Algorithm: backend.SlidingWindow, Limit: backend.MaxLimit, Period: 24 * time.Hour, Cost: 1},
		backend.Request{Key: "ip:u", Algorithm: backend.FixedWindow, Limit: backend.MaxLimit, Period: time.Hour, Cost: 1},
	)
	// The floor of any script-based limiter: EVALSHA of a script that does
	// nothing, and of one that only reads TIME, GETs and SETs one key.
	nothing := redis.NewScript("return 1")
	minimal := redis.NewScript(`local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], string.format('%.0f', t[1] * 1000000 + t[2]), 'PX', 60000)
return {0, 0, 1, 0, 0, 0}`)
	floorKey := []string{prefix + ":floor"}
	rolling := []backend.Request{{Key: "rolling:u", Limit: backend.MaxLimit, Period: time.Minute, Cost: 1}}
	rollingRaw := s.batchCmd(ctx, []*op{{key: prefix + ":rolling:raw", lone: loneCall{req: rolling[0], now: -1}}}).Args()
	if err := batchScript.Load(ctx, client).Err(); err != nil {
		b.Fatal(err)
	}
	// A key the deny cache answers: spent for the next hour.
	denied := []backend.Request{{Key: "otp:flood", Algorithm: backend.SlidingLog, Limit: 1, Period: time.Hour, Cost: 1}}
	for range 2 {
		if _, err := s.Decide(ctx, denied); err != nil {
			b.Fatal(err)
		}
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"ping", func() error { return client.Ping(ctx).Err() }},
		{"floor=evalsha", func() error { return nothing.Run(ctx, client, floorKey).Err() }},
		{"floor=time+get+set", func() error { return minimal.Run(ctx, client, floorKey).Err() }},
		{"rolling=script", func() error { return client.Do(ctx, rollingRaw...).Err() }},
		{"rolling=store", func() error { _, err := s.Decide(ctx, rolling); return err }},
		{"rules=1", func() error { _, err := s.Decide(ctx, one); return err }},
		{"rules=3", func() error { _, err := s.Decide(ctx, three); return err }},
		{"denied", func() error {
			res, err := s.Decide(ctx, denied)
			if err == nil && res[0].Allowed {
				return errors.New("a denied key was admitted")
			}
			return err
		}},
	}
	for _, op := range ops {
		if err := op.do(); err != nil { // also loads the script
			b.Fatal(err)
		}
		b.Run(op.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := op.do(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(op.name+"/goroutines=64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := op.do(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
