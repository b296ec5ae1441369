package ceilinggrpc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ceiling-go/ceiling"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// A KeyFunc returns the value a rule limits by for one call: the method
// called (the full name, "/pkg.Service/Method"), and ctx, which carries the
// call's peer ([peer.FromContext]) and incoming metadata
// ([metadata.FromIncomingContext]).
//
// As for the HTTP middleware's [ceiling.KeyFunc], an error wrapping
// [ceiling.ErrNoKey] leaves the rule out of the call's decision, and any
// other error refuses the call as codes.InvalidArgument before any backend
// call. An empty value with a nil error is refused as well.
type KeyFunc func(ctx context.Context, method string) (string, error)

// FullMethod keys by the method called, "/pkg.Service/Method": a budget per
// method, shared by every caller. Join it with a caller key for a budget
// per caller and method.
func FullMethod(_ context.Context, method string) (string, error) {
	if method == "" {
		return "", ceiling.ErrNoKey
	}
	return method, nil
}

// ForMethods applies fn only to calls of the given methods: full method
// names ("/pkg.Service/Method"), or whole services written as their prefix
// ("/pkg.Service/"). Other calls leave the rule out. ForMethods panics
// without methods or with a nil fn.
func ForMethods(fn KeyFunc, methods ...string) KeyFunc {
	if fn == nil || len(methods) == 0 {
		panic("ceilinggrpc: ForMethods needs a key function and at least one method")
	}
	methods = append([]string(nil), methods...)
	return func(ctx context.Context, method string) (string, error) {
		for _, m := range methods {
			if method == m || strings.HasSuffix(m, "/") && strings.HasPrefix(method, m) {
				return fn(ctx, method)
			}
		}
		return "", ceiling.ErrNoKey
	}
}

// Metadata keys by the value of an incoming metadata entry (an API key, a
// tenant id set by your gateway). A missing or empty entry yields
// [ceiling.ErrNoKey]; several values that differ are refused as
// codes.InvalidArgument, as the HTTP middleware refuses a repeated header.
// Binary entries ("-bin") are keyed by their bytes.
//
// Metadata is written by the caller: key on an entry whose value is the
// thing limited and checked later, or that your own gateway sets and
// strips from callers, never on one a caller can vary to obtain fresh
// budgets. Client addresses come from [PeerAddr] or [ClientIP]. Metadata
// panics if name is empty.
func Metadata(name string) KeyFunc {
	if name == "" {
		panic(`ceilinggrpc: Metadata("")`)
	}
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		var v string
		for _, s := range vs {
			switch {
			case s == "":
			case v == "":
				v = s
			case s != v:
				return "", fmt.Errorf("metadata %q: %d different values", name, len(vs))
			}
		}
		if v == "" {
			return "", ceiling.ErrNoKey
		}
		return v, nil
	}
}

// PeerAddr keys by the IP address of the call's peer and believes no
// metadata entry: behind a proxy it is the proxy's address. It is the gRPC
// form of [ceiling.RemoteAddr] (IPv6 grouped by /64, IPv4-mapped addresses
// as IPv4), the only address key that cannot be spoofed without trusting
// anybody. A Unix-socket peer has no address: every such call keys as "@".
//
// Like RemoteAddr, it warns once per process (logged, and in
// [ceiling.Limiter.Health]) when a call from a private or loopback peer
// carries "x-forwarded-for" or "forwarded": the sign of a proxy the
// configuration left out, whose clients all share its budget. Until then,
// a call from such a peer costs two entry lookups; any other call reads no
// entry, so its cost does not grow with the call's metadata.
func PeerAddr(ctx context.Context, _ string) (string, error) {
	var r http.Request
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		r.RemoteAddr = p.Addr.String()
		if !proxyShown.Load() {
			r.Header = untrustedForwarding(ctx, p.Addr)
		}
	}
	return ceiling.RemoteAddr(&r)
}

// proxyShown is set once PeerAddr has shown ceiling.RemoteAddr a call from
// a private or loopback peer with forwarding entries, which makes it warn
// (once per process): later calls need not look for them.
var proxyShown atomic.Bool

// untrustedForwarding returns, for a call from a private or loopback TCP
// peer, its forwarding entries as the headers ceiling.RemoteAddr checks,
// or nil when the peer is public or the call has none.
func untrustedForwarding(ctx context.Context, a net.Addr) http.Header {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsPrivate() && !tcp.IP.IsLoopback() {
		return nil
	}
	xff := metadata.ValueFromIncomingContext(ctx, "x-forwarded-for")
	fwd := metadata.ValueFromIncomingContext(ctx, "forwarded")
	if len(xff) == 0 && len(fwd) == 0 {
		return nil
	}
	proxyShown.Store(true)
	return http.Header{"X-Forwarded-For": xff, "Forwarded": fwd}
}

// peerAddr is the address of ctx's peer, "" when it has none.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// ClientIP keys by the client's IP address with exactly the trust model of
// [ceiling.ClientIP], whose options it takes: with none, the peer's
// address, and no metadata is believed or read (it is [PeerAddr]). Behind
// your own proxies, say which entry they write and the ranges they connect
// from (ceiling.TrustXForwardedFor("10.0.0.0/8") reads the
// "x-forwarded-for" entry only on calls whose peer is in 10.0.0.0/8).
// ClientIP returns an error naming a bad option.
//
// With options, the key is handed every text entry, as by [FromHTTP]
// without names, because the options do not say which header they read.
// Pass the key through FromHTTP with the entry your proxies write,
// FromHTTP(ceiling.Must(ceiling.ClientIP(opts...)), "x-forwarded-for"), and it
// reads that entry alone: a call padded with entries costs it no more.
func ClientIP(opts ...ceiling.IPOption) (KeyFunc, error) {
	k, err := ceiling.ClientIP(opts...)
	if err != nil {
		return nil, err
	}
	if len(opts) == 0 {
		return PeerAddr, nil
	}
	return FromHTTP(k), nil
}

// MustClientIP is like [ClientIP] but panics on a configuration error.
func MustClientIP(opts ...ceiling.IPOption) KeyFunc {
	k, err := ClientIP(opts...)
	if err != nil {
		panic(err)
	}
	return k
}

// FromHTTP uses one of ceiling's HTTP key functions for gRPC calls, so that
// the verified-JWT keys ([ceiling.JWTSubject], [ceiling.JWTClaim], which
// read the "authorization" entry), the address keys and their trust
// model, and your own key functions serve both protocols. fn sees a
// request that stands for the call: method POST, URL path the full method,
// RemoteAddr the peer's address, the ":authority" as Host, an empty body
// and ctx as its context, and as its headers the text metadata entries
// named in headers ("authorization", "x-forwarded-for"), each under the
// header of the same name. Name the entries fn reads: then no other entry
// is copied, however many a caller adds to the call (looking up an entry
// that is missing scans the entries' names, copying nothing). Without
// names fn sees every text entry (binary "-bin" entries are left out),
// each copied on every call. Key functions that read the body
// (ceiling.BodyField) find it empty: key on metadata instead. FromHTTP
// panics with a nil fn or an empty or binary name.
func FromHTTP(fn ceiling.KeyFunc, headers ...string) KeyFunc {
	if fn == nil {
		panic("ceilinggrpc: FromHTTP(nil)")
	}
	var names []string // nil: every entry
	for _, h := range headers {
		if h == "" || strings.HasPrefix(h, ":") || strings.HasSuffix(strings.ToLower(h), "-bin") {
			panic(fmt.Sprintf("ceilinggrpc: FromHTTP: %q is not a text metadata entry", h))
		}
		names = append(names, strings.ToLower(h))
	}
	return func(ctx context.Context, method string) (string, error) {
		return fn(callRequest(ctx, method, names))
	}
}

// callRequest is the *http.Request that stands for a call in FromHTTP:
// with names, its headers are those entries alone, each looked up in the
// metadata; without, every text entry.
func callRequest(ctx context.Context, method string, names []string) *http.Request {
	r := &http.Request{
		Method:     http.MethodPost,
		URL:        &url.URL{Path: method},
		RequestURI: method,
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     make(http.Header, len(names)),
		Body:       http.NoBody,
		RemoteAddr: peerAddr(ctx),
	}
	if names != nil {
		// grpc-go stores incoming keys in lower case, as HTTP/2 sends
		// them: a present entry is one map access, and a missing one a
		// scan of the keys that copies nothing.
		if vs := metadata.ValueFromIncomingContext(ctx, ":authority"); len(vs) > 0 {
			r.Host = vs[0]
		}
		for _, k := range names {
			if vs := metadata.ValueFromIncomingContext(ctx, k); len(vs) > 0 {
				r.Header[textproto.CanonicalMIMEHeaderKey(k)] = vs
			}
		}
		return r.WithContext(ctx)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for k, vs := range md {
		switch {
		case k == ":authority":
			if len(vs) > 0 {
				r.Host = vs[0]
			}
		case strings.HasPrefix(k, ":"), strings.HasSuffix(k, "-bin"):
		default:
			r.Header[textproto.CanonicalMIMEHeaderKey(k)] = vs
		}
	}
	return r.WithContext(ctx)
}

// Join keys by several values at once (the caller and the method), as
// [ceiling.Join] does: the parts are length-prefixed, so ("a|b", "c") and
// ("a", "b|c") differ. If any part yields [ceiling.ErrNoKey] or an error,
// so does Join. Join panics without functions or with a nil one.
func Join(fns ...KeyFunc) KeyFunc {
	if len(fns) == 0 || containsNil(fns) {
		panic("ceilinggrpc: Join needs key functions, none nil")
	}
	return func(ctx context.Context, method string) (string, error) {
		var b []byte
		for _, fn := range fns {
			v, err := fn(ctx, method)
			if err != nil {
				return "", err
			}
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			b = append(b, v...)
		}
		return string(b), nil
	}
}

func containsNil(fns []KeyFunc) bool {
	for _, fn := range fns {
		if fn == nil {
			return true
		}
	}
	return false
}
