package ceilinggrpc_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// callCtx is the context of a server call from addr with metadata md.
func callCtx(addr string, md ...string) context.Context {
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(md...))
	if addr != "" {
		ap, _ := net.ResolveTCPAddr("tcp", addr)
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: ap})
	}
	return ctx
}

func key(t *testing.T, fn ceilinggrpc.KeyFunc, ctx context.Context, method string) string {
	t.Helper()
	v, err := fn(ctx, method)
	if errors.Is(err, ceiling.ErrNoKey) {
		return "<none>"
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return v
}

func TestKeyFunctions(t *testing.T) {
	secret := []byte("a test secret of at least thirty-two bytes")
	sub := ceilinggrpc.FromHTTP(ceiling.Must(ceiling.JWTClaim("sub", func(*jwt.Token) (any, error) { return secret, nil }, []string{"HS256"})))
	token, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(secret)
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory"}).SignedString([]byte("not the secret, but long enough!!"))
	namedSub := ceilinggrpc.FromHTTP(ceiling.Must(ceiling.JWTClaim("sub", func(*jwt.Token) (any, error) { return secret, nil }, []string{"HS256"})), "Authorization")
	hostKey := func(r *http.Request) (string, error) { return r.Host, nil }
	host, namedHost := ceilinggrpc.FromHTTP(hostKey), ceilinggrpc.FromHTTP(hostKey, "x-tenant")
	const m = "/shop.Orders/Create"
	for _, tc := range []struct {
		name string
		fn   ceilinggrpc.KeyFunc
		ctx  context.Context
		want string
	}{
		{"full method", ceilinggrpc.FullMethod, callCtx(""), m},
		{"for its method", ceilinggrpc.ForMethods(ceilinggrpc.FullMethod, m), callCtx(""), m},
		{"for its service", ceilinggrpc.ForMethods(ceilinggrpc.FullMethod, "/shop.Orders/"), callCtx(""), m},
		{"not for another method", ceilinggrpc.ForMethods(ceilinggrpc.FullMethod, "/shop.Orders/List", "/shop.Order/"), callCtx(""), "<none>"},
		{"metadata", ceilinggrpc.Metadata("X-Tenant"), callCtx("", "x-tenant", "acme"), "acme"},
		{"metadata repeated alike", ceilinggrpc.Metadata("x-tenant"), callCtx("", "x-tenant", "acme", "x-tenant", "acme"), "acme"},
		{"metadata repeated unlike", ceilinggrpc.Metadata("x-tenant"), callCtx("", "x-tenant", "acme", "x-tenant", "evil"), `error: metadata "x-tenant": 2 different values`},
		{"metadata missing", ceilinggrpc.Metadata("x-tenant"), callCtx(""), "<none>"},
		{"join", ceilinggrpc.Join(ceilinggrpc.Metadata("x-tenant"), ceilinggrpc.FullMethod), callCtx("", "x-tenant", "acme"), "4:acme19:" + m},
		{"join missing part", ceilinggrpc.Join(ceilinggrpc.Metadata("x-tenant"), ceilinggrpc.FullMethod), callCtx(""), "<none>"},
		{"peer v4", ceilinggrpc.PeerAddr, callCtx("203.0.113.5:4711"), "203.0.113.5"},
		{"peer v6 by /64", ceilinggrpc.PeerAddr, callCtx("[2001:db8:1:2:aaaa::1]:4711"), "2001:db8:1:2::/64"},
		{"no peer", ceilinggrpc.PeerAddr, callCtx(""), "<none>"},
		{"verified JWT", sub, callCtx("", "authorization", "Bearer "+token), "alice"},
		{"verified JWT, the entry named", namedSub, callCtx("", "authorization", "Bearer "+token), "alice"},
		{"an entry not named", ceilinggrpc.FromHTTP(ceiling.Header("X-Tenant"), "authorization"), callCtx("", "x-tenant", "acme"), "<none>"},
		{"host from :authority", host, callCtx("", ":authority", "api.example"), "api.example"},
		{"host from :authority, entries named", namedHost, callCtx("", ":authority", "api.example"), "api.example"},
		{"forged JWT", sub, callCtx("", "authorization", "Bearer "+forged), "<none>"},
	} {
		if got := key(t, tc.fn, tc.ctx, m); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Peer address keys obey ceiling's trust model: no metadata entry is
// believed by default, so a caller that sends a fresh x-forwarded-for on
// every call gets no fresh budget; behind trusted proxies the entry they
// write is read, only on calls from them.
func TestPeerKeysTrustNoMetadataByDefault(t *testing.T) {
	behindProxy := ceilinggrpc.MustClientIP(ceiling.TrustXForwardedFor("10.0.0.0/8"))
	for _, tc := range []struct {
		name string
		fn   ceilinggrpc.KeyFunc
		peer string
		want []codes.Code
	}{
		{"PeerAddr, spoofing client", ceilinggrpc.PeerAddr, "203.0.113.5:1", []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
		{"ClientIP(), spoofing client", ceilinggrpc.MustClientIP(), "203.0.113.5:1", []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
		{"trusted proxies, spoofing client", behindProxy, "203.0.113.5:1", []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}},
		{"trusted proxies, from the proxy", behindProxy, "10.1.2.3:1", []codes.Code{codes.OK, codes.OK, codes.OK, codes.OK}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := ceilinggrpc.MustNew(apiLimiter(t, 2), []ceilinggrpc.Rule{{Name: "api", Key: tc.fn}})
			s := serveLimiter(t, g)
			var errs []error
			for i := range len(tc.want) {
				errs = append(errs, s.check(t, testPeer, tc.peer, "x-forwarded-for", fmt.Sprintf("198.51.100.%d", i+1)))
			}
			if got := codesOf(errs...); !equalCodes(got, tc.want) {
				t.Errorf("codes %v, want %v", got, tc.want)
			}
		})
	}
}

func TestKeyHelpersPanicOnMisuse(t *testing.T) {
	for name, f := range map[string]func(){
		"Metadata(\"\")":      func() { ceilinggrpc.Metadata("") },
		"ForMethods()":        func() { ceilinggrpc.ForMethods(ceilinggrpc.FullMethod) },
		"Join()":              func() { ceilinggrpc.Join() },
		"Join(nil)":           func() { ceilinggrpc.Join(nil) },
		"FromHTTP(nil)":       func() { ceilinggrpc.FromHTTP(nil) },
		"FromHTTP(fn, \"\")":  func() { ceilinggrpc.FromHTTP(ceiling.RemoteAddr, "") },
		"FromHTTP(fn, x-bin)": func() { ceilinggrpc.FromHTTP(ceiling.RemoteAddr, "x-key-Bin") },
		"FromHTTP(fn, :path)": func() { ceilinggrpc.FromHTTP(ceiling.RemoteAddr, ":path") },
		"MustClientIP(/)":     func() { ceilinggrpc.MustClientIP(ceiling.TrustXForwardedFor("not a range")) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}

// padded is the context of a call from addr with metadata md and n more
// entries that no key reads, as a caller padding its calls sends them.
func padded(addr string, n int, md ...string) context.Context {
	for i := range n {
		md = append(md, fmt.Sprintf("x-pad-%d", i), "v")
	}
	return callCtx(addr, md...)
}

// A key reads the entries it needs and no other, so a caller who pads a
// call with entries makes it cost no more: the allocations of a key on a
// call with 10,000 more entries are those on a call with none.
func TestKeysReadOnlyWhatTheyNeed(t *testing.T) {
	secret := []byte("a test secret of at least thirty-two bytes")
	token, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice"}).SignedString(secret)
	md := []string{"x-forwarded-for", "198.51.100.7", "authorization", "Bearer " + token, "x-api-key", "k"}
	for _, tc := range []struct {
		name string
		fn   ceilinggrpc.KeyFunc
	}{
		{"PeerAddr", ceilinggrpc.PeerAddr},
		{"ClientIP()", ceilinggrpc.MustClientIP()},
		{"Metadata", ceilinggrpc.Metadata("x-api-key")},
		{"FromHTTP(ClientIP, x-forwarded-for)", ceilinggrpc.FromHTTP(ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedFor("10.0.0.0/8"))), "x-forwarded-for")},
		{"FromHTTP(JWTSubject, authorization)", ceilinggrpc.FromHTTP(ceiling.Must(ceiling.JWTClaim("sub", func(*jwt.Token) (any, error) { return secret, nil }, []string{"HS256"})), "Authorization")},
	} {
		// AllocsPerRun counts the whole process's allocations, so another
		// test's goroutines still winding down can only add to a count: the
		// fewest of three runs is the key's own.
		allocs := func(ctx context.Context) float64 {
			fewest := math.Inf(1)
			for range 3 {
				fewest = min(fewest, testing.AllocsPerRun(20, func() {
					if _, err := tc.fn(ctx, checkMethod); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
				}))
			}
			return fewest
		}
		bare, pad := allocs(padded("10.1.2.3:4711", 0, md...)), allocs(padded("10.1.2.3:4711", 10000, md...))
		if pad != bare {
			t.Errorf("%s: %v allocations on a call padded with 10,000 entries, %v without", tc.name, pad, bare)
		}
	}
}

// The gRPC address keys give the HTTP keys' answers for the same peer and
// entries: the trust model is ceiling's, whichever entries a key reads.
func TestAddressKeysAgreeWithHTTP(t *testing.T) {
	xff := []ceiling.IPOption{ceiling.TrustXForwardedFor("10.0.0.0/8")}
	fwd := []ceiling.IPOption{ceiling.TrustForwarded("10.0.0.0/8")}
	for _, tc := range []struct {
		name string
		grpc ceilinggrpc.KeyFunc
		http ceiling.KeyFunc
	}{
		{"PeerAddr", ceilinggrpc.PeerAddr, ceiling.RemoteAddr},
		{"ClientIP()", ceilinggrpc.MustClientIP(), ceiling.Must(ceiling.ClientIP())},
		{"ClientIP(xff)", ceilinggrpc.MustClientIP(xff...), ceiling.Must(ceiling.ClientIP(xff...))},
		{"FromHTTP(ClientIP(xff), x-forwarded-for)", ceilinggrpc.FromHTTP(ceiling.Must(ceiling.ClientIP(xff...)), "x-forwarded-for"), ceiling.Must(ceiling.ClientIP(xff...))},
		{"ClientIP(forwarded)", ceilinggrpc.MustClientIP(fwd...), ceiling.Must(ceiling.ClientIP(fwd...))},
		{"FromHTTP(ClientIP(forwarded), forwarded)", ceilinggrpc.FromHTTP(ceiling.Must(ceiling.ClientIP(fwd...)), "forwarded"), ceiling.Must(ceiling.ClientIP(fwd...))},
		{"ClientIP(x-real-ip)", ceilinggrpc.MustClientIP(ceiling.TrustHeader("X-Real-IP", "10.0.0.0/8")), ceiling.Must(ceiling.ClientIP(ceiling.TrustHeader("X-Real-IP", "10.0.0.0/8")))},
		{"ClientIP(hops)", ceilinggrpc.MustClientIP(ceiling.TrustXForwardedForHops(2)), ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedForHops(2)))},
	} {
		for _, peerAddr := range []string{"10.1.2.3:1", "203.0.113.5:1", "[2001:db8:1:2::9]:1"} {
			for _, md := range [][]string{
				nil,
				{"x-forwarded-for", "198.51.100.1"},
				{"x-forwarded-for", "6.6.6.6, 198.51.100.1"},                                // a spoofed left-most entry
				{"x-forwarded-for", "6.6.6.6", "x-forwarded-for", "198.51.100.1, 10.9.9.9"}, // two lines, a trusted hop
				{"x-forwarded-for", "not an address, 198.51.100.1"},
				{"forwarded", `for=6.6.6.6, for="[2001:db8:cafe::1]:4711"`},
				{"x-real-ip", "198.51.100.3"},
				{"x-forwarded-for", "198.51.100.1", "forwarded", "for=198.51.100.2", "x-real-ip", "198.51.100.3"},
			} {
				r := httptest.NewRequest("POST", checkMethod, nil)
				r.RemoteAddr = peerAddr
				for i := 0; i < len(md); i += 2 {
					r.Header.Add(md[i], md[i+1])
				}
				want := httpKey(tc.http, r)
				for _, n := range []int{0, 100} {
					if got := key(t, tc.grpc, padded(peerAddr, n, md...), checkMethod); got != want {
						t.Errorf("%s from %s with %q (%d more entries): %q, the HTTP key says %q", tc.name, peerAddr, md, n, got, want)
					}
				}
			}
		}
	}
}

func httpKey(fn ceiling.KeyFunc, r *http.Request) string {
	v, err := fn(r)
	if errors.Is(err, ceiling.ErrNoKey) {
		return "<none>"
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return v
}
