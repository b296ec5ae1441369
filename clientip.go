package ceiling

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
)

// ClientIP returns a [KeyFunc] that keys requests by the client's IP address.
//
// # Trust model
//
// With no option the key is the connection's peer (r.RemoteAddr) and every
// header is ignored: the only address a client cannot choose. Behind
// reverse proxies, say how to find the client with exactly one of:
//
//   - [TrustXForwardedFor], [TrustForwarded] or [TrustHeader]: the header
//     your proxies write and the ranges they connect from. The safest form:
//     a request that did not come through them cannot choose its key.
//   - [TrustXForwardedForHops] or [TrustForwardedHops]: how many proxies
//     every request passes, when their addresses are not published. Safe
//     only if the service cannot be reached except through all of them.
//   - [TrustHeaderFromAnywhere]: a header a CDN sets on every request,
//     read whoever the peer is. Safe only if the CDN strips the client's
//     copy and is the only way in.
//
// With ranges, a request whose peer is not trusted is keyed by the peer. A
// list header is walked from the right, skipping trusted proxies: the first
// untrusted address is the client, so the left-most entry, which the client
// wrote, is never believed for being first. An entry that is not an address
// ("unknown") stops the walk at the nearest trusted hop; when every entry
// is trusted, the left-most is the client. A single-address header is read
// only from a trusted peer, its last line winning.
//
// A private or loopback peer sending forwarding headers the key does not
// trust is a proxy left out of the configuration: logged once per process
// and reported by every [Limiter.Health].
//
// IPv4-mapped addresses are keyed as IPv4 and zones dropped, so one client
// cannot appear as two; IPv6 clients are keyed by their /64 ([IPv6Prefix]).
// A peer that is not an IP address (a Unix socket) is keyed as it is. The
// KeyFunc is safe for simultaneous use.
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c := &clientIP{v6bits: 64}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("ceiling: ClientIP: nil option")
		}
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c.key, nil
}

// RemoteAddr keys by the connection's peer, ignoring every header: it is
// [ClientIP] with no option, the one IP key nobody can spoof.
func RemoteAddr(r *http.Request) (string, error) { return peerOnly.key(r) }

var peerOnly = clientIP{v6bits: 64}

// An IPOption configures [ClientIP].
type IPOption func(*clientIP) error

// TrustXForwardedFor makes [ClientIP] read X-Forwarded-For when the peer is
// one of the trusted proxies, given as CIDR prefixes ("10.0.0.0/8") or
// addresses.
func TrustXForwardedFor(proxies ...string) IPOption {
	return trust(fromXFF, "TrustXForwardedFor", proxies)
}

// TrustForwarded makes [ClientIP] read the RFC 7239 Forwarded header (its
// for= parameters) when the peer is one of the trusted proxies.
func TrustForwarded(proxies ...string) IPOption {
	return trust(fromForwarded, "TrustForwarded", proxies)
}

// TrustHeader makes [ClientIP] read a header holding the one client address
// (CF-Connecting-IP, X-Real-IP...) when the peer is a trusted proxy. The
// last line counts; a missing or malformed value keys by the peer. Use it
// only with a proxy that overwrites the header on every request.
func TrustHeader(name string, proxies ...string) IPOption {
	return func(c *clientIP) error {
		if err := c.setHeader(name, "TrustHeader"); err != nil {
			return err
		}
		return trust(fromNamed, "TrustHeader", proxies)(c)
	}
}

// TrustHeaderFromAnywhere makes [ClientIP] read a single-address header
// whoever the peer is, for a CDN whose addresses are not published. Safe
// only when the CDN sets the header on every request, removes the client's
// copy, and is the only way in; prefer [TrustHeader] with its ranges.
func TrustHeaderFromAnywhere(name string) IPOption {
	return func(c *clientIP) error {
		if err := c.setHeader(name, "TrustHeaderFromAnywhere"); err != nil {
			return err
		}
		if err := c.claim(fromNamed, "TrustHeaderFromAnywhere", false); err != nil {
			return err
		}
		c.anywhere = true
		return nil
	}
}

// TrustXForwardedForHops makes [ClientIP] count proxies instead of knowing
// their addresses: every request passes exactly n, each appending to
// X-Forwarded-For, so the client is the n-th entry from the right (or the
// nearest address right of it when it is not one). Use it only when the
// service cannot be reached except through the n proxies.
func TrustXForwardedForHops(n int) IPOption {
	return trustHops(fromXFF, "TrustXForwardedForHops", n)
}

// TrustForwardedHops is [TrustXForwardedForHops] for the RFC 7239 Forwarded
// header: the client is the for= of the n-th element from the right.
func TrustForwardedHops(n int) IPOption {
	return trustHops(fromForwarded, "TrustForwardedHops", n)
}

func trustHops(h proxyHeader, name string, n int) IPOption {
	return func(c *clientIP) error {
		if n < 1 || n > maxHops {
			return fmt.Errorf("ceiling: %s(%d): want 1 to %d proxies", name, n, maxHops)
		}
		if err := c.claim(h, name, false); err != nil {
			return err
		}
		c.hops = n
		return nil
	}
}

// maxHops bounds TrustXForwardedForHops: no real chain of proxies is longer.
const maxHops = 32

// PrivateRanges returns the loopback and private ranges (RFC 1918, RFC
// 4193), for proxies on the same host or network:
// TrustXForwardedFor(PrivateRanges()...). Carrier-grade NAT is left out.
func PrivateRanges() []string {
	return []string{"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7"}
}

// IPv6Prefix sets how many leading bits of an IPv6 address make the key
// (default 64); 128 keys every address apart.
func IPv6Prefix(bits int) IPOption {
	return func(c *clientIP) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("ceiling: IPv6Prefix(%d): want 1 to 128 bits", bits)
		}
		c.v6bits = bits
		return nil
	}
}

type proxyHeader uint8

const (
	fromPeer proxyHeader = iota
	fromXFF
	fromForwarded
	fromNamed // a single-address header: X-Real-IP, CF-Connecting-IP...
)

type clientIP struct {
	header   proxyHeader
	name     string // the canonical header name for fromNamed
	trusted  []netip.Prefix
	hops     int  // > 0: trust by counting this many proxies
	anywhere bool // fromNamed read whoever the peer is
	v6bits   int
	how      string // the option that set header, for error messages
	ranges   bool   // header is trusted from the ranges in trusted
}

// headerName is the canonical name of the header c reads.
func (c *clientIP) headerName() string {
	switch c.header {
	case fromXFF:
		return "X-Forwarded-For"
	case fromForwarded:
		return "Forwarded"
	}
	return c.name
}

// claim records that the option how decides where the client comes from.
// Only the address-range options may be repeated (for the same header, each
// call adding ranges); any other second option is refused.
func (c *clientIP) claim(h proxyHeader, how string, ranges bool) error {
	if c.how != "" && !(ranges && c.ranges && c.header == h) {
		return fmt.Errorf("ceiling: %s: already trusting %s (%s); trust the one header your proxies write, one way", how, c.headerName(), c.how)
	}
	c.header, c.how, c.ranges = h, how, ranges
	return nil
}

// setHeader checks and records the header a single-address option reads.
func (c *clientIP) setHeader(name, fn string) error {
	if name == "" {
		return fmt.Errorf("ceiling: %s: no header name", fn)
	}
	canon := http.CanonicalHeaderKey(name)
	switch canon {
	case "X-Forwarded-For", "Forwarded":
		return fmt.Errorf("ceiling: %s(%q): a list header; use TrustXForwardedFor or TrustForwarded", fn, name)
	}
	if c.name != "" && c.name != canon {
		return fmt.Errorf("ceiling: %s(%q): already trusting %s; trust the one header your proxies write", fn, name, c.name)
	}
	c.name = canon
	return nil
}

func trust(h proxyHeader, name string, proxies []string) IPOption {
	return func(c *clientIP) error {
		if len(proxies) == 0 {
			return fmt.Errorf("ceiling: %s: no trusted proxies given", name)
		}
		if err := c.claim(h, name, true); err != nil {
			return err
		}
		for _, s := range proxies {
			p, err := parseTrusted(s)
			if err != nil {
				return fmt.Errorf("ceiling: %s: %w", name, err)
			}
			c.trusted = append(c.trusted, p)
		}
		return nil
	}
}

// parseTrusted reads a CIDR prefix or a single address, folding IPv4-mapped
// prefixes to IPv4 so that they match the unmapped addresses they describe.
func parseTrusted(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Errorf("bad proxy prefix %q: %w", s, err)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, fmt.Errorf("bad proxy address %q: %w", s, err)
		}
		if a.Zone() != "" {
			return p, fmt.Errorf("bad proxy address %q: zones are not allowed", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Zone() != "" {
		return p, fmt.Errorf("bad proxy prefix %q: zones are not allowed", s)
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return p, fmt.Errorf("bad proxy prefix %q: IPv4-mapped prefixes need at least 96 bits", s)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.Bits() == 0 {
		return p, fmt.Errorf("proxy prefix %q trusts every address, which lets any client write the header", s)
	}
	return p.Masked(), nil
}

func (c *clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (c *clientIP) key(r *http.Request) (string, error) {
	host, peer, ok := peer4(r.RemoteAddr)
	if !ok {
		host = peerHost(r.RemoteAddr)
		peer, ok = normalAddr(host)
	}
	if !ok {
		if r.RemoteAddr == "" {
			return "", ErrNoKey
		}
		return r.RemoteAddr, nil
	}
	a := c.client(r.Header, peer)
	if a == peer && !untrustedProxy.reported.Load() && (peer.IsPrivate() || peer.IsLoopback()) {
		c.checkPeer(r.Header, peer)
	}
	if a == peer && a.Is4() && !strings.Contains(host, ":") {
		// netip accepts only canonical dotted quads, so the peer's own text
		// is the key: no string to build on the common path.
		return host, nil
	}
	return c.format(a), nil
}

// client returns the client's address for a request from peer.
func (c *clientIP) client(h http.Header, peer netip.Addr) netip.Addr {
	switch {
	case c.header == fromPeer:
		return peer
	case c.hops > 0:
		return c.walk(h[c.headerName()], c.header == fromForwarded, peer)
	case !c.anywhere && !c.isTrusted(peer):
		return peer
	}
	switch c.header {
	case fromNamed:
		vs := h[c.name]
		if len(vs) == 0 {
			return peer
		}
		if a, ok := parseHop(vs[len(vs)-1]); ok {
			return a
		}
		return peer
	case fromXFF:
		return c.walk(h["X-Forwarded-For"], false, peer)
	default:
		return c.walk(h["Forwarded"], true, peer)
	}
}

// untrustedProxy records, once per process, the first request from a
// private or loopback peer that carried forwarding headers a ClientIP key
// did not trust: the sign of a proxy left out of the configuration.
var untrustedProxy struct {
	reported atomic.Bool
	warning  atomic.Pointer[string] // for health reports, without the address
}

// processLogger is where process-wide warnings are logged: the logger of the
// first Limiter created (nil: slog.Default).
var processLogger atomic.Pointer[slog.Logger]

// keyFuncWarnings are the process-wide warnings key functions raised, for
// [Limiter.Health].
func keyFuncWarnings() []string {
	if w := untrustedProxy.warning.Load(); w != nil {
		return []string{*w}
	}
	return nil
}

// checkPeer reports, once per process, a private or loopback peer whose
// forwarding header the key does not trust: a proxy the configuration
// left out, behind which every client shares one budget.
func (c *clientIP) checkPeer(h http.Header, peer netip.Addr) {
	var header string
	switch {
	case c.hops > 0 || c.anywhere || c.header != fromPeer && c.isTrusted(peer):
		return // the peer is trusted; it fell back to itself for other reasons
	case c.header == fromPeer && len(h["X-Forwarded-For"]) > 0:
		header = "X-Forwarded-For"
	case c.header == fromPeer && len(h["Forwarded"]) > 0:
		header = "Forwarded"
	case c.header == fromPeer:
		return
	default:
		if header = c.headerName(); len(h[header]) == 0 {
			return
		}
	}
	if !untrustedProxy.reported.CompareAndSwap(false, true) {
		return
	}
	why, fix := "the peer is not among the proxies "+c.how+" trusts", "If it is your load balancer or reverse proxy, add its address range to "+c.how+"."
	if c.header == fromPeer {
		opt := "TrustXForwardedFor"
		if header == "Forwarded" {
			opt = "TrustForwarded"
		}
		why = "the client-address key trusts no proxy"
		fix = "If it is your load balancer or reverse proxy, key on ceiling.Must(ceiling.ClientIP(ceiling." + opt + "(its address range))), or " +
			opt + "Hops(n) when its addresses are not known; if clients reach the service directly, the header is theirs and rightly ignored."
	}
	untrustedProxy.warning.Store(new(fmt.Sprintf("requests from a private-range peer carry %s, but %s, so every client behind it shares one budget. %s", header, why, fix)))
	logger := processLogger.Load()
	if logger == nil {
		logger = slog.Default()
	}
	logger.Warn(fmt.Sprintf("ceiling: requests from %s carry %s, but %s, so every client behind it shares one budget. %s (Logged once per process.)", peer, header, why, fix),
		slog.String("peer", peer.String()), slog.String("header", header))
}

// walk reads a list header from the right. Counting hops, the client is
// the c.hops-th entry, or the nearest address right of an unusable one, or
// the left-most of a shorter list. Otherwise the first hop that is not a
// trusted proxy is the client; an unusable entry stops at the nearest
// trusted hop; all trusted, the left-most. Only entries trusted proxies
// wrote are ever parsed, so nothing the client wrote can shift them.
func (c *clientIP) walk(lines []string, forwarded bool, peer netip.Addr) netip.Addr {
	hop, seen := peer, 0
	for i := len(lines) - 1; i >= 0; i-- {
		for v := lines[i]; v != ""; {
			var a netip.Addr
			var ok bool
			v, a, ok = cutLastHop(v, forwarded)
			switch seen++; {
			case c.hops > 0:
				if ok {
					hop = a
				}
				if seen == c.hops {
					return hop
				}
			case !ok:
				return hop
			case !c.isTrusted(a):
				return a
			default:
				hop = a
			}
		}
	}
	return hop
}

// cutLastHop cuts the last entry off a line of a list header (Forwarded
// when forwarded, else X-Forwarded-For) and parses its address; ok is false
// when the entry holds no usable address.
func cutLastHop(line string, forwarded bool) (before string, a netip.Addr, ok bool) {
	if forwarded {
		before, e := cutLastElement(line)
		a, ok = forwardedFor(e)
		return before, a, ok
	}
	j := strings.LastIndexByte(line, ',')
	a, ok = parseHop(line[j+1:])
	return line[:max(j, 0)], a, ok
}

// cutLastElement cuts the last element off a Forwarded line, skipping
// commas inside quoted strings (a quote preceded by an odd number of
// backslashes is escaped).
func cutLastElement(s string) (before, last string) {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			n := 0
			for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
				n++
			}
			if !quoted || n%2 == 0 {
				quoted = !quoted
			}
		case ',':
			if !quoted {
				return s[:i], s[i+1:]
			}
		}
	}
	return "", s
}

// format turns an address into a key: IPv4 as is, IPv6 as its prefix.
func (c *clientIP) format(a netip.Addr) string {
	if a.Is4() || c.v6bits >= 128 {
		return a.String()
	}
	p, _ := a.Prefix(c.v6bits)
	return p.String()
}

// peer4 parses the common r.RemoteAddr "a.b.c.d:port" in one pass, a third
// of what peerHost and normalAddr cost; ok is false whenever they might
// answer otherwise, for them to decide.
func peer4(s string) (host string, a netip.Addr, ok bool) {
	var ip [4]byte
	field, n, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if digits > 0 && n == 0 { // a leading zero, which netip refuses
				return "", netip.Addr{}, false
			}
			if n = n*10 + int(c-'0'); n > 255 {
				return "", netip.Addr{}, false
			}
			digits++
		case c == '.' && digits > 0 && field < 3:
			ip[field] = byte(n)
			field, n, digits = field+1, 0, 0
		case c == ':' && digits > 0 && field == 3:
			for j := i + 1; j < len(s); j++ {
				if c := s[j]; c == ':' || c == '[' || c == ']' {
					return "", netip.Addr{}, false
				}
			}
			ip[3] = byte(n)
			return s[:i], netip.AddrFrom4(ip), true
		default:
			return "", netip.Addr{}, false
		}
	}
	return "", netip.Addr{}, false
}

// peerHost is the host part of r.RemoteAddr.
func peerHost(s string) string {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return s
	}
	return host
}

// parseHop reads one X-Forwarded-For or X-Real-IP entry: an address, with
// or without a port, IPv6 with or without brackets.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	if a, ok := normalAddr(s); ok {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalAddr(ap.Addr().String())
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		return normalAddr(s[1 : len(s)-1])
	}
	return netip.Addr{}, false
}

// normalAddr parses an address and folds the forms that could let one
// client appear as several, or alias a trusted proxy: IPv4-mapped IPv6
// becomes IPv4, and zones are dropped.
func normalAddr(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, false
	}
	return a.Unmap().WithZone(""), true
}

// forwardedFor returns the address in the for= parameter of one RFC 7239
// Forwarded element. Obfuscated identifiers ("_hidden"), "unknown", a
// missing or repeated for=, and malformed syntax are not usable.
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for elem != "" {
		var pair string
		pair, elem = cutUnquoted(elem, ';')
		name, value, ok := strings.Cut(pair, "=")
		if !ok {
			if strings.Trim(pair, " \t") == "" {
				continue
			}
			return netip.Addr{}, false
		}
		if !strings.EqualFold(strings.Trim(name, " \t"), "for") {
			continue
		}
		if found {
			return netip.Addr{}, false
		}
		found = true
		v, ok := unquote(strings.Trim(value, " \t"))
		if !ok {
			return netip.Addr{}, false
		}
		node = v
	}
	if !found {
		return netip.Addr{}, false
	}
	return forwardedNode(node)
}

// forwardedNode parses RFC 7239's node: IPv4 or "[IPv6]", each with an
// optional ":port" (a number or an obfuscated port).
func forwardedNode(node string) (netip.Addr, bool) {
	if node == "" || node[0] == '_' || strings.EqualFold(node, "unknown") {
		return netip.Addr{}, false
	}
	host, port := node, ""
	if node[0] == '[' {
		end := strings.IndexByte(node, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host, port = node[1:end], node[end+1:]
		if port != "" {
			if port[0] != ':' {
				return netip.Addr{}, false
			}
			port = port[1:]
		}
		a, ok := normalAddr(host)
		if !ok || !validNodePort(port, true) {
			return netip.Addr{}, false
		}
		return a, true
	}
	if a, ok := normalAddr(host); ok { // lenient: an IPv6 address without brackets
		return a, true
	}
	host, port, ok := strings.Cut(node, ":")
	if !ok {
		return netip.Addr{}, false
	}
	a, ok := normalAddr(host)
	if !ok || !a.Is4() || !validNodePort(port, false) {
		return netip.Addr{}, false
	}
	return a, true
}

func validNodePort(p string, emptyOK bool) bool {
	if p == "" {
		return emptyOK
	}
	if p[0] == '_' {
		return len(p) > 1
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// cutUnquoted cuts s around the first sep that is outside a quoted string.
func cutUnquoted(s string, sep byte) (before, after string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// unquote returns a token as is and a quoted-string without its quotes and
// escapes. It allocates only when the string holds an escape.
func unquote(s string) (string, bool) {
	if s == "" || s[0] != '"' {
		return s, !strings.ContainsAny(s, "\" \t")
	}
	if len(s) < 2 || s[len(s)-1] != '"' {
		return "", false
	}
	inner := s[1 : len(s)-1]
	if !strings.ContainsAny(inner, "\\\"") {
		return inner, true
	}
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		switch c := inner[i]; c {
		case '"':
			return "", false
		case '\\':
			i++
			if i == len(inner) {
				return "", false
			}
			b.WriteByte(inner[i])
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
