package redistest

// Partition cuts the proxy's clients off from the server until
// [Proxy.Heal]: every open connection is closed and every new one is
// closed as soon as it is accepted, so nothing a client sends reaches the
// server, while the server keeps serving everybody else (a network
// partition of one instance).
func (p *Proxy) Partition() {
	p.refusing.Store(true)
	p.Cut()
}

// Heal ends a [Proxy.Partition]: new connections are relayed again.
func (p *Proxy) Heal() { p.refusing.Store(false) }
