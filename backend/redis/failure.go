package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// classify wraps err with the kind of failure its cause shows
// (backend.ErrUnreachable, ErrAuth, ErrReadOnly, ErrOutOfMemory), so that
// the limiter can report it without the error's text; otherwise err as is.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, backend.ErrUnreachable), errors.Is(err, backend.ErrAuth),
		errors.Is(err, backend.ErrReadOnly), errors.Is(err, backend.ErrOutOfMemory):
		return err
	case isUnreachable(err):
		return unreachable(err)
	case redis.HasErrorPrefix(err, "NOAUTH"), redis.HasErrorPrefix(err, "WRONGPASS"),
		redis.HasErrorPrefix(err, "NOPERM"), strings.Contains(err.Error(), "unauthenticated"):
		// or, to a long command, "Protocol error: unauthenticated multibulk length"
		return fmt.Errorf("%w: %w", backend.ErrAuth, err)
	case redis.HasErrorPrefix(err, "READONLY"):
		return fmt.Errorf("%w: %w", backend.ErrReadOnly, err)
	case redis.HasErrorPrefix(err, "OOM"):
		return fmt.Errorf("%w: %w", backend.ErrOutOfMemory, err)
	}
	return err
}

// authCloses is how long after a refused authentication an EOF is blamed
// on it: Redis closes the connection after "unauthenticated multibulk".
const authCloses = time.Second

// classify is classify, remembering refused authentication for
// authCloses so that the closed connection it leaves is reported as such.
func (s *Store) classify(err error) error {
	err = classify(err)
	switch {
	case errors.Is(err, backend.ErrAuth):
		s.authRefused.Store(time.Now().UnixNano())
	case errors.Is(err, io.EOF) && time.Now().UnixNano()-s.authRefused.Load() < int64(authCloses):
		return fmt.Errorf("%w: connection closed after the server refused authentication: %w", backend.ErrAuth, err)
	}
	return err
}

func unreachable(err error) error {
	return fmt.Errorf("%w: %w", backend.ErrUnreachable, err)
}

// isUnreachable reports whether no connection could be made or kept.
func isUnreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	for _, target := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
		syscall.EPIPE, syscall.ENETUNREACH, syscall.EHOSTUNREACH, io.EOF, io.ErrUnexpectedEOF,
		net.ErrClosed, redis.ErrClosed} {
		if errors.Is(err, target) {
			return true
		}
	}
	return errors.As(err, &dns)
}

// stale reports whether err may come from a stale Cluster slot map: a
// node unreachable or late, or CLUSTERDOWN/TRYAGAIN.
func stale(err error) bool {
	var ne net.Error
	return isUnreachable(err) || (errors.As(err, &ne) && ne.Timeout()) ||
		redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "TRYAGAIN")
}

// reloadEvery bounds how often a Store asks for a slot map reload: soon
// after a replica's promotion, without flooding the survivors.
const reloadEvery = 250 * time.Millisecond

// healCluster asks the Cluster client to reload its slot map (at most
// once per reloadEvery): go-redis reloads only on MOVED or every minute,
// and a dead master sends no MOVED.
func (s *Store) healCluster() {
	now := time.Now().UnixNano()
	last := s.reloaded.Load()
	if now-last < int64(reloadEvery) || !s.reloaded.CompareAndSwap(last, now) {
		return
	}
	s.cluster.ReloadState(context.Background())
}

// dialLog keeps, fed by the client's dial hook, a record of what each node
// did (nodeRecord) and one of any node's, so that a call out of budget
// while go-redis retries a refused dial names it, and logs the failed
// dials (sampled).
type dialLog struct {
	all    nodeRecord                // any node's
	nodes  sync.Map                  // address -> *nodeRecord
	logs   *atomic.Pointer[storeLog] // the Store's
	hooked sync.Map                  // on Cluster: the node clients hooked (*redis.Client -> struct{})
}

// node returns the record of the node at addr ("": any node's).
func (d *dialLog) node(addr string) *nodeRecord {
	if addr == "" {
		return &d.all
	}
	v, ok := d.nodes.Load(addr)
	if !ok {
		v, _ = d.nodes.LoadOrStore(addr, new(nodeRecord))
	}
	return v.(*nodeRecord)
}

type dialFailure struct {
	at  time.Time
	err error
}

// dialRecent is how long before a call a refused dial still says the node
// is down: go-redis re-dials a refused connection every 100ms
// (DialerRetryTimeout) within a call, and once a pool's dials all failed
// its probe re-dials every second, failing fast meanwhile; so while the
// node stays down a failure is never older than that second.
const dialRecent = time.Second

// refused returns the last failed dial to the node at addr ("": any node)
// if it failed after t, or was refused (not timed out) at most dialRecent
// before t; and only if no dial succeeded since, and the
// node replied to nothing since (repliedAt, UnixNano): the node's fault, not
// this process's, however late this process got to the call.
func (d *dialLog) refused(addr string, t time.Time, repliedAt int64) error {
	f := d.node(addr).failed.Load()
	switch {
	case f == nil || f.at.Before(t.Add(-dialRecent)) || f.at.UnixNano() <= repliedAt:
		return nil
	case f.at.Before(t) && timedOut(f.err):
		// a dial that timed out before the call may have been this
		// process's delay; a refusal is the node's answer
		return nil
	}
	return f.err
}

// DialHook records failed dials, forgotten once one succeeds, and watches
// the connections dialed (watchConn), in the nodes' records; the other
// hooks pass through.
func (d *dialLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		var f *dialFailure
		if err != nil {
			f = &dialFailure{at: time.Now(), err: err}
			d.logs.Load().warn(kindDial, fmt.Sprintf("failed to dial %s: %v", addr, err))
		}
		n := d.node(addr)
		d.all.failed.Store(f)
		n.failed.Store(f)
		if err == nil {
			c = watchConn(c, n, &d.all)
		}
		return c, err
	}
}

func (d *dialLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// watch installs d on client (on Cluster, on every node client the client
// makes from now on; see hook for those it made before).
func (d *dialLog) watch(client redis.UniversalClient) {
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(d.hook)
		return
	}
	client.AddHook(d)
	// A client used before New holds connections the hook never saw.
	d.all.unwatched.Store(client.PoolStats().TotalConns > 0)
}

// hook installs d on a Cluster node's client once. OnNewNode misses the
// node clients a Cluster client made before New (a startup ping makes
// them all, replicas included), so pipelinerFor hooks a master's client
// too: without it, a dead node's refused dials and its silent sockets go
// unseen, and its calls are blamed on this process (ErrUnread).
func (d *dialLog) hook(n *redis.Client) {
	if _, done := d.hooked.LoadOrStore(n, struct{}{}); !done {
		n.AddHook(d)
		if n.PoolStats().TotalConns > 0 {
			d.node(n.Options().Addr).unwatched.Store(true)
		}
	}
}
