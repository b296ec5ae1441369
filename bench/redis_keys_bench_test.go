package bench

import (
	"fmt"
	"testing"
)

// BenchmarkRedisKeys is one decision of one rule on a local redis-server,
// on one hot key and spread over 100k keys: latency serial, and throughput
// from 64 goroutines, for ceiling's Redis store (which batches concurrent
// decisions into pipelined round trips) and the Redis peers, each on its own
// client of 64 connections. The counters are BenchmarkRedis's.
func BenchmarkRedisKeys(top *testing.B) {
	addr := redisAddr(top)
	for _, nk := range []int{1, 100_000} {
		ks := keys(nk)
		for _, mode := range []string{"serial", "parallel64"} {
			for _, lib := range redisLibs {
				top.Run(fmt.Sprintf("keys=%s/%s/%s", count(nk), mode, lib.name), func(b *testing.B) {
					f := setup(b, top, func() *redisFixture {
						checkRedis(top, lib, addr, 1, 1000)
						c, cnt := newClient(top, addr)
						return &redisFixture{decider: lib.new(top, c, prefix(top), hugeRules(1)), count: cnt, admin: redisFor(top, addr)}
					})
					if mode == "serial" {
						redisSerial(b, f, ks)
					} else {
						redisParallel(b, f, ks)
					}
				})
			}
		}
	}
}
