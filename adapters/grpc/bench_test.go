package ceilinggrpc_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ceiling-go/ceiling"
	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
)

// BenchmarkKeys times one key function on a call carrying n metadata
// entries besides the ones it reads: what a caller who pads a call with
// entries makes every key of every call cost.
func BenchmarkKeys(b *testing.B) {
	keys := []struct {
		name string
		fn   ceilinggrpc.KeyFunc
	}{
		{"PeerAddr", ceilinggrpc.PeerAddr},
		{"ClientIP", ceilinggrpc.MustClientIP()},
		{"ClientIP-XFF", ceilinggrpc.MustClientIP(ceiling.TrustXForwardedFor("10.0.0.0/8"))},
		{"ClientIP-header", ceilinggrpc.MustClientIP(ceiling.TrustHeader("CF-Connecting-IP", "10.0.0.0/8"))},
		{"ClientIP-XFF-named", ceilinggrpc.FromHTTP(ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedFor("10.0.0.0/8"))), "x-forwarded-for")},
		{"Metadata", ceilinggrpc.Metadata("x-api-key")},
		{"Metadata-missing", ceilinggrpc.Join(ceilinggrpc.FullMethod, ceilinggrpc.Metadata("x-tenant"))},
	}
	for _, n := range []int{0, 10000} {
		// What grpc-go puts in every call's metadata, and the entries keys read.
		md := []string{":authority", "api.example", "content-type", "application/grpc", "user-agent", "grpc-go/1.85.0",
			"x-forwarded-for", "198.51.100.7", "cf-connecting-ip", "198.51.100.8", "x-api-key", "k"}
		for i := range n {
			md = append(md, fmt.Sprintf("x-pad-%d", i), "v")
		}
		ctx := callCtx("10.1.2.3:4711", md...)
		for _, k := range keys {
			b.Run(fmt.Sprintf("%s/n=%d", k.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := k.fn(ctx, checkMethod); err != nil && !errors.Is(err, ceiling.ErrNoKey) {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
