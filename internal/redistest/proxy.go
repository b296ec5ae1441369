package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy on a free loopback port in front of a Redis server,
// for tests of what a client does when the network, not the server, fails:
// a reply lost after the server ran the command ([Proxy.DropReply]), a
// server that stops answering without closing anything ([Proxy.Stall]),
// every connection cut at once ([Proxy.Cut]). Clients connect to
// [Proxy.Addr] instead of the server's address.
//
// Its methods are safe for simultaneous use by multiple goroutines.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:port" address.
	Addr string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   map[*proxyConn]bool
	drop    []dropping // pending DropReply matches
	loses   []func()   // every LoseReplyLate's lose, for Close
	stalled bool
	thawed  chan struct{} // closed when a stall ends

	dropped  atomic.Int64
	refusing atomic.Bool // partitioned: new connections are closed at once
}

// dropping is a pending DropReply: a match, lower case, and the gate its
// reply waits for before it is lost (nil: none).
type dropping struct {
	match []byte
	gate  chan struct{}
}

// proxyConn is one client connection and its server connection.
type proxyConn struct {
	client, server net.Conn
	// doomed is set when a command matching a DropReply went to the
	// server: the next bytes it answers are dropped and the pair closed.
	doomed atomic.Bool
	gate   chan struct{} // a doomed reply waits for it (LoseReplyLate)
}

// NewProxy starts a proxy to target (a "host:port") and stops it, cutting
// every connection, when the test ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*proxyConn]bool{}, thawed: make(chan struct{})}
	close(p.thawed)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refusing.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		p.conns[pc] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.upstream(pc)
		go p.downstream(pc)
	}
}

// upstream copies the client's commands to the server, dooming the
// connection's next reply when a command matches a pending DropReply.
func (p *Proxy) upstream(pc *proxyConn) {
	defer p.wg.Done()
	defer p.closePair(pc)
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			if d, ok := p.matchDrop(buf[:n]); ok {
				pc.gate = d.gate
				pc.doomed.Store(true)
			}
			if _, werr := pc.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// downstream copies the server's replies to the client, unless the
// connection is doomed (the reply is lost and both sides closed) or the
// proxy is stalled (the reply waits).
func (p *Proxy) downstream(pc *proxyConn) {
	defer p.wg.Done()
	defer p.closePair(pc)
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thawed := p.thawed
			p.mu.Unlock()
			<-thawed
			if pc.doomed.Load() {
				if pc.gate != nil {
					<-pc.gate
				}
				p.dropped.Add(1)
				return
			}
			if _, werr := pc.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) matchDrop(cmd []byte) (dropping, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.drop) == 0 {
		return dropping{}, false
	}
	lower := bytes.ToLower(cmd)
	for i, d := range p.drop {
		if bytes.Contains(lower, d.match) {
			p.drop = append(p.drop[:i], p.drop[i+1:]...)
			return d, true
		}
	}
	return dropping{}, false
}

func (p *Proxy) closePair(pc *proxyConn) {
	pc.client.Close()
	pc.server.Close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// DropReply arms the proxy to lose one reply: the next data the client
// sends that contains match (compared case-insensitively, e.g. "fcall")
// reaches the server, which runs it, but the server's answer never reaches
// the client: the proxy closes that connection instead, as a network
// failure between the two would. Each call arms one more drop.
func (p *Proxy) DropReply(match string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = append(p.drop, dropping{match: bytes.ToLower([]byte(match))})
}

// LoseReplyLate is [Proxy.DropReply], except that the client keeps
// waiting for the lost reply, its connection open, until lose is called:
// a command the server ran whose caller does not yet know its outcome,
// while other connections carry on.
func (p *Proxy) LoseReplyLate(match string) (lose func()) {
	gate := make(chan struct{})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = append(p.drop, dropping{match: bytes.ToLower([]byte(match)), gate: gate})
	var once sync.Once
	lose = func() { once.Do(func() { close(gate) }) }
	p.loses = append(p.loses, lose)
	return lose
}

// Dropped returns how many replies the proxy has lost so far.
func (p *Proxy) Dropped() int { return int(p.dropped.Load()) }

// Stall holds every reply from the server, on every connection, until
// [Proxy.Resume]: commands reach the server and run, but clients wait as
// for a server that froze or a network that went silent, with no
// connection closed.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.thawed = make(chan struct{})
	}
}

// Resume delivers the replies a [Proxy.Stall] held, and every later one.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.thawed)
	}
}

// Cut closes every open connection, as a network failure or a server-side
// CLIENT KILL would; new connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.client.Close()
		pc.server.Close()
	}
}

// Close stops the proxy and cuts every connection. NewProxy registers it
// with t.Cleanup; calling it again is a no-op.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Resume()
	p.mu.Lock()
	loses := p.loses
	p.mu.Unlock()
	for _, lose := range loses {
		lose()
	}
	p.Cut()
	p.wg.Wait()
}
