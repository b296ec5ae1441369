package redis

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// nodeRecord is what one node (or, as dialLog.all, any) did, as the dial
// hook saw it: its last failed dial, forgotten once a dial succeeds
// (dialLog.refused), and the connections go-redis dialed to it, watched so
// that a call out of budget can be judged exactly: reply bytes waiting in
// the kernel are this process's delay in reading them; a round trip
// written long enough ago with no byte back is the node's silence (see
// judge).
type nodeRecord struct {
	failed atomic.Pointer[dialFailure] // nil after a dial succeeded
	mu     sync.Mutex
	conns  map[*watchedConn]struct{}
	// unread is the UnixNano of the latest read whose deadline ended it
	// while reply bytes waited; lost is the write time of the latest
	// round trip whose read's deadline ended it with no byte waiting.
	unread, lost atomic.Int64
	// unwatched: the client held connections to the node before the hook
	// was installed (a client used before New), which conns lacks.
	unwatched atomic.Bool
}

// judgement is what the sockets say about a call out of budget.
type judgement int

const (
	unjudged judgement = iota // no exact signal here: the heuristic decides
	behind                    // a reply waits to be read, or the call is not written yet
	silent                    // written, and the node sent nothing back: its failure
)

// judge says whether a call written at written (UnixNano), whose budget
// ran out, waits for this process or for the node: reply bytes waiting
// unread on a connection written since the call or with a round trip in
// flight (or a read that timed out over some since the write) are this
// process's delay; a round trip written since then, at
// least half a budget ago, that got no byte back while none waits
// anywhere, is the node's silence, however loaded this process is.
// Otherwise the call's reply is being read, or its write has not reached
// the kernel yet: this process's delay too (unjudged with no connection,
// or, when the client held connections before the hook, with no watched
// write since the call's).
func (n *nodeRecord) judge(written int64, budget time.Duration) judgement {
	if !exactSockets || n == nil {
		return unjudged
	}
	if n.unread.Load() >= written {
		return behind
	}
	now := time.Now().UnixNano()
	quiet, seen := n.lost.Load() >= written, false
	n.mu.Lock()
	defer n.mu.Unlock()
	for c := range n.conns {
		// bytes on a connection with no round trip in flight since before
		// the call (a subscriber's unread message) answer nobody waiting
		wr := c.wrote.Load()
		if (wr >= written || wr > c.read.Load()) && c.waiting() > 0 {
			return behind
		}
		seen = seen || wr >= written
		quiet = quiet || (wr >= written && c.read.Load() < wr && now-wr >= int64(budget/2))
	}
	switch {
	case quiet:
		return silent
	case len(n.conns) == 0:
		return unjudged // no connection watched: no signal
	case n.unwatched.Load() && !seen:
		return unjudged // no watched write since: maybe on a connection dialed before New
	}
	return behind
}

func (n *nodeRecord) add(c *watchedConn) {
	n.mu.Lock()
	if n.conns == nil {
		n.conns = make(map[*watchedConn]struct{})
	}
	n.conns[c] = struct{}{}
	n.mu.Unlock()
}

func (n *nodeRecord) remove(c *watchedConn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// watchedConn is a connection go-redis dialed, recording when bytes were
// last written to and read from it, and what a read its deadline ended
// left in the kernel.
type watchedConn struct {
	net.Conn
	raw         syscall.RawConn // of the socket under any TLS; nil: none
	nodes       [2]*nodeRecord  // its node's and dialLog.all
	wrote, read atomic.Int64    // UnixNano
}

// sysConn is a watchedConn over a connection that is a syscall.Conn: go-redis
// health-checks an idle pooled connection by peeking its socket, which it
// finds only on the outer connection.
type sysConn struct{ *watchedConn }

func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// watchConn wraps c, dialed to the node of node, and counts it in both.
func watchConn(c net.Conn, node, all *nodeRecord) net.Conn {
	w := &watchedConn{Conn: c, nodes: [2]*nodeRecord{node, all}}
	inner := c
	for range 8 { // under TLS (tls.Conn.NetConn), ciphertext waiting says as much
		if sc, ok := inner.(syscall.Conn); ok {
			w.raw, _ = sc.SyscallConn()
			break
		}
		u, ok := inner.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		inner = u.NetConn()
	}
	for _, n := range w.nodes {
		n.add(w)
	}
	if _, ok := c.(syscall.Conn); ok {
		return sysConn{w}
	}
	return w
}

// NetConn returns the connection c watches, as tls.Conn does, so that
// go-redis finds the socket under a TLS connection to peek it.
func (c *watchedConn) NetConn() net.Conn { return c.Conn }

// waiting returns the bytes the kernel holds unread on c's socket; -1 when
// it cannot tell.
func (c *watchedConn) waiting() int {
	if c.raw == nil {
		return -1
	}
	n := -1
	if c.raw.Control(func(fd uintptr) { n = unreadBytes(fd) }) != nil {
		return -1
	}
	return n
}

func (c *watchedConn) Read(p []byte) (int, error) {
	if f := beforeRead.Load(); f != nil {
		(*f)()
	}
	n, err := c.Conn.Read(p)
	now := time.Now().UnixNano()
	if n > 0 {
		c.read.Store(now)
	}
	if err != nil && timedOut(err) {
		if c.waiting() > 0 {
			for _, s := range c.nodes {
				s.unread.Store(now)
			}
		} else if wr := c.wrote.Load(); wr > c.read.Load() {
			for _, s := range c.nodes {
				s.lost.Store(max(s.lost.Load(), wr))
			}
		}
	}
	return n, err
}

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.wrote.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *watchedConn) Close() error {
	for _, n := range c.nodes {
		n.remove(c)
	}
	return c.Conn.Close()
}

// beforeRead, set by tests, runs before each read of a watched connection
// (a background load's too, hence atomic): a reader this process is too
// busy to run.
var beforeRead atomic.Pointer[func()]
