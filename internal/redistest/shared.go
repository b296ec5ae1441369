package redistest

import (
	"sync"
	"testing"
)

// shared holds the servers one test binary shares. They are started on
// first use and stopped by Main after every test has run.
var shared struct {
	mu          sync.Mutex
	mainRunning bool

	server    *Instance
	serverErr error

	cluster    *ClusterInstance
	clusterErr error
}

// Main runs the tests, stops the shared servers started by [Shared] and
// [SharedCluster], and reports the tests that skipped for want of Redis
// in one line, which go test shows even without -v. Every package using
// this package declares
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
//
// because a server shared by many tests cannot be stopped by any one
// test's cleanup, and must not outlive the test binary; the helpers fail a
// test whose package does not.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.mainRunning = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	if shared.server != nil {
		shared.server.Close()
	}
	if shared.cluster != nil {
		shared.cluster.Close()
	}
	shared.mu.Unlock()
	reportSkips(testedPackage())
	return code
}

// Shared returns the redis-server this test binary shares, starting it on
// first use. Tests sharing it must keep their keys apart with [KeyPrefix]
// and must not kill, freeze, restart or flush it. It requires [Main].
func Shared(tb testing.TB) *Instance {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server == nil && shared.serverErr == nil {
		shared.server, shared.serverErr = startInstance(bin, kind{})
	}
	if shared.serverErr != nil {
		tb.Fatal(shared.serverErr)
	}
	return shared.server
}

// SharedCluster returns the three-master cluster this test binary shares,
// starting it on first use. The same rules as for [Shared] apply.
func SharedCluster(tb testing.TB) *ClusterInstance {
	tb.Helper()
	server := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil && shared.clusterErr == nil {
		shared.cluster, shared.clusterErr = startCluster(server, cli)
	}
	if shared.clusterErr != nil {
		tb.Fatal(shared.clusterErr)
	}
	return shared.cluster
}

// requireMain fails tb unless the package's TestMain runs [Main], which
// every helper needs: it stops the shared servers and reports skips.
func requireMain(tb testing.TB) {
	tb.Helper()
	shared.mu.Lock()
	running := shared.mainRunning
	shared.mu.Unlock()
	if !running {
		tb.Fatal("redistest: the package's TestMain must call redistest.Main (it stops shared servers and reports skipped tests): " +
			"func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }")
	}
}
