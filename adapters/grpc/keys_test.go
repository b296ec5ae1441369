package ceilinggrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	sub := ceilinggrpc.FromHTTP(ceiling.MustJWTClaim("sub", func(*jwt.Token) (any, error) { return secret, nil }, []string{"HS256"}))
	token, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(secret)
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory"}).SignedString([]byte("not the secret, but long enough!!"))
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
		"Metadata(\"\")":  func() { ceilinggrpc.Metadata("") },
		"ForMethods()":    func() { ceilinggrpc.ForMethods(ceilinggrpc.FullMethod) },
		"Join()":          func() { ceilinggrpc.Join() },
		"Join(nil)":       func() { ceilinggrpc.Join(nil) },
		"FromHTTP(nil)":   func() { ceilinggrpc.FromHTTP(nil) },
		"MustClientIP(/)": func() { ceilinggrpc.MustClientIP(ceiling.TrustXForwardedFor("not a range")) },
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
