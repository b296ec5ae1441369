package bench

import (
	"fmt"
	"testing"
)

// BenchmarkRedisKeys is one decision of one rule on a local redis-server,
// on one hot key and spread over 100k keys: latency serial, and throughput
// from 64 goroutines, for ceiling (the middleware, Limiter.Decide and the
// store alone, which batches concurrent decisions into pipelined round
// trips) and the Redis peers, each on its own client of 64 connections.
// The counters are BenchmarkRedis's.
func BenchmarkRedisKeys(top *testing.B) {
	addr := redisAddr(top)
	for _, nk := range []int{1, 100_000} {
		for _, mode := range []string{"serial", "parallel64"} {
			for _, lib := range redisLibs {
				ks := redisKeysFor(lib, nk)
				top.Run(fmt.Sprintf("keys=%s/%s/%s", count(nk), mode, lib.name), func(b *testing.B) {
					f := setup(b, top, func() *redisFixture { return newRedisFixture(top, lib, addr, 1) })
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
