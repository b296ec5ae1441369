package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// classify wraps err with the kind of failure its root cause shows
// (backend.ErrUnreachable, ErrAuth, ErrReadOnly, ErrOutOfMemory), so that
// the limiter can report the kind without the error's text, which names
// addresses and keys. An error of no known kind is returned as is.
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
		// A server that wants a password answers a client without one
		// NOAUTH, or, for a command of many arguments (a decision's
		// EVALSHA), "Protocol error: unauthenticated multibulk length".
		return fmt.Errorf("%w: %w", backend.ErrAuth, err)
	case redis.HasErrorPrefix(err, "READONLY"):
		return fmt.Errorf("%w: %w", backend.ErrReadOnly, err)
	case redis.HasErrorPrefix(err, "OOM"):
		return fmt.Errorf("%w: %w", backend.ErrOutOfMemory, err)
	}
	return err
}

// authCloses is how long after a server refused a client for want of a
// password an EOF on its connections is blamed on the refusal: Redis
// closes the connection after "unauthenticated multibulk length", and
// go-redis, which keeps it, sees EOF on its next command.
const authCloses = time.Second

// classify is the package's classify, remembering refused authentication
// for authCloses so that the closed connection it leaves behind is
// reported as the authentication failure it is.
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

// isUnreachable reports whether err says no connection could be made or
// kept: a refused, reset or timed-out dial, a connection closed under a
// command, a client closed by its owner.
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

// stale reports whether err may come from a Cluster client routing by a
// slot map that no longer holds: a node that cannot be reached or answers
// late (a master that died before its replica was promoted), or a cluster
// that says it is down for the slot.
func stale(err error) bool {
	var ne net.Error
	return isUnreachable(err) || (errors.As(err, &ne) && ne.Timeout()) ||
		redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "TRYAGAIN")
}

// reloadEvery bounds how often a Store asks its Cluster client to reload
// the slot map: often enough that keys on a failed master's slots are
// decided again soon after its replica's promotion, rarely enough that an
// outage does not flood the surviving nodes with CLUSTER SLOTS.
const reloadEvery = 250 * time.Millisecond

// healCluster asks the Cluster client to reload its slot map, at most once
// per reloadEvery. go-redis reloads on its own only every minute or on a
// MOVED reply, and a dead master sends none: without this, keys on its
// slots would keep failing long after its replica took over.
func (s *Store) healCluster() {
	now := time.Now().UnixNano()
	last := s.reloaded.Load()
	if now-last < int64(reloadEvery) || !s.reloaded.CompareAndSwap(last, now) {
		return
	}
	s.cluster.ReloadState(context.Background())
}

// dialLog remembers the last failed dial of a Store's client, so that a
// call that runs out of budget while go-redis is still retrying the dial
// names the refused connection instead of a timeout, and logs it to the
// Store's logger (see WithLogger), sampled, whoever's command the dial was
// for.
type dialLog struct {
	last atomic.Pointer[dialFailure]
	logs *atomic.Pointer[storeLog] // the Store's
}

type dialFailure struct {
	at  time.Time
	err error
}

// since returns the last dial error if it happened after t.
func (d *dialLog) since(t time.Time) error {
	f := d.last.Load()
	if f == nil || f.at.Before(t) {
		return nil
	}
	return f.err
}

// DialHook records failed dials; ProcessHook and ProcessPipelineHook pass
// through (redis.Hook has all three).
func (d *dialLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			d.last.Store(&dialFailure{at: time.Now(), err: err})
			d.logs.Load().warn("dial", fmt.Sprintf("failed to dial %s: %v", addr, err))
		}
		return c, err
	}
}

func (d *dialLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// watch installs d on client: on a Cluster client, on every node client
// it creates from now on.
func (d *dialLog) watch(client redis.UniversalClient) {
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(d) })
		return
	}
	client.AddHook(d)
}
