package redistest

import "testing"

// ServerWithConfig is [Server] with more redis.conf lines, for tests of a
// misconfigured or constrained server: "requirepass s3cret", "replicaof
// 127.0.0.1 6379", "maxmemory 1mb". The server is the test's own and stops
// when the test ends.
func ServerWithConfig(tb testing.TB, lines ...string) *Instance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	inst, err := startInstance(bin, kind{extra: lines})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(inst.Close)
	return inst
}
