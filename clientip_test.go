package ceiling

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func ipRequest(peer string, headers ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestClientIPWithoutProxiesIgnoresEveryHeader(t *testing.T) {
	r := ipRequest("203.0.113.7:5555",
		"X-Forwarded-For", "198.51.100.1",
		"Forwarded", "for=198.51.100.2",
		"X-Real-IP", "198.51.100.3",
		"True-Client-IP", "198.51.100.4")
	for name, fn := range map[string]KeyFunc{"ClientIP()": MustClientIP(), "RemoteAddr": RemoteAddr} {
		if got, want := mustKey(t, fn, r), "203.0.113.7"; got != want {
			t.Errorf("%s = %q, want the peer %q", name, got, want)
		}
	}
}

func TestClientIPNormalisesAddresses(t *testing.T) {
	for _, tc := range []struct {
		peer string
		opts []IPOption
		want string
	}{
		{"192.0.2.1:80", nil, "192.0.2.1"},
		{"[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", nil, "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::1]:443", nil, "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"[2001:db8:1:2:aaaa::1]:443", []IPOption{IPv6Prefix(128)}, "2001:db8:1:2:aaaa::1"},
		{"[2001:db8:1:2:aaaa::1]:443", []IPOption{IPv6Prefix(48)}, "2001:db8:1::/48"},
		{"192.0.2.1", nil, "192.0.2.1"}, // a bare host, as some listeners give
		{"@", nil, "@"},                 // a Unix socket: one shared budget
	} {
		if got := mustKey(t, MustClientIP(tc.opts...), ipRequest(tc.peer)); got != tc.want {
			t.Errorf("peer %s: key %q, want %q", tc.peer, got, tc.want)
		}
	}
	if _, err := RemoteAddr(ipRequest("")); !errors.Is(err, ErrNoKey) {
		t.Errorf("empty RemoteAddr: err = %v, want ErrNoKey", err)
	}
}

// Every IPv6 address of one /64 is one client: rotating addresses inside it
// buys nothing.
func TestIPv6AddressRotationInsideA64BuysNothing(t *testing.T) {
	fn := MustClientIP()
	first := mustKey(t, fn, ipRequest("[2001:db8:aa:bb::1]:1"))
	for i := range 50 {
		peer := fmt.Sprintf("[2001:db8:aa:bb:%x:%x:%x:%x]:1", rand.Uint32()&0xffff, rand.Uint32()&0xffff, i, rand.Uint32()&0xffff)
		if got := mustKey(t, fn, ipRequest(peer)); got != first {
			t.Fatalf("%s keyed %q, %q for the same /64", peer, got, first)
		}
	}
}

func TestClientIPBehindTrustedProxies(t *testing.T) {
	xff := MustClientIP(TrustXForwardedFor("10.0.0.0/8", "2001:db8:ffff::/48"))
	fwd := MustClientIP(TrustForwarded("10.0.0.0/8"))
	real := MustClientIP(TrustXRealIP("10.0.0.1"))
	private := MustClientIP(TrustXForwardedFor(PrivateRanges()...))
	for _, tc := range []struct {
		name string
		fn   KeyFunc
		r    *http.Request
		want string
	}{
		{"untrusted peer: headers ignored", xff, ipRequest("203.0.113.9:1", "X-Forwarded-For", "198.51.100.1"), "203.0.113.9"},
		{"one proxy", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"one proxy, spoofed left part", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "1.1.1.1, 2.2.2.2, 198.51.100.1"), "198.51.100.1"},
		{"two proxies", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, 198.51.100.1, 10.0.0.2"), "198.51.100.1"},
		{"lines concatenate in order", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.1, 10.0.0.2"), "198.51.100.1"},
		{"IPv6 proxy and client", xff, ipRequest("[2001:db8:ffff::1]:1", "X-Forwarded-For", "2001:db8:1:2::99, 2001:db8:ffff::2"), "2001:db8:1:2::/64"},
		{"mapped proxy address is trusted", xff, ipRequest("[::ffff:10.0.0.1]:1", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"entries with ports", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.1:4000, [2001:db8::1]:80"), "2001:db8::/64"},
		{"all hops trusted: the left-most", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "10.1.1.1, 10.0.0.2"), "10.1.1.1"},
		{"empty header: the peer", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", ""), "10.0.0.1"},
		{"garbage next to the peer: the peer", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.1, garbage"), "10.0.0.1"},
		{"garbage past a trusted hop: that hop", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.1, not-an-ip, 10.0.0.7"), "10.0.0.7"},
		{"garbage left of the client: ignored", xff, ipRequest("10.0.0.1:1", "X-Forwarded-For", "<script>, 198.51.100.1"), "198.51.100.1"},
		{"Forwarded ignored by an XFF key", xff, ipRequest("10.0.0.1:1", "Forwarded", "for=198.51.100.1"), "10.0.0.1"},
		{"private ranges", private, ipRequest("127.0.0.1:1", "X-Forwarded-For", "198.51.100.1, 192.168.1.1"), "198.51.100.1"},

		{"Forwarded: one proxy", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=198.51.100.1;proto=https"), "198.51.100.1"},
		{"Forwarded: quoted IPv6 with port", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::/64"},
		{"Forwarded: quoted IPv4 with port", fwd, ipRequest("10.0.0.1:1", "Forwarded", `For="198.51.100.1:4711"`), "198.51.100.1"},
		{"Forwarded: right to left", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for=6.6.6.6, for=198.51.100.1;by=10.0.0.2, for=10.0.0.2`), "198.51.100.1"},
		{"Forwarded: commas inside quotes", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for=6.6.6.6;x="a,for=7.7.7.7", for=198.51.100.1`), "198.51.100.1"},
		{"Forwarded: lines concatenate", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=6.6.6.6", "Forwarded", "for=198.51.100.1, for=10.0.0.3"), "198.51.100.1"},
		{"Forwarded: obfuscated client: the trusted hop", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=_hidden, for=10.0.0.3"), "10.0.0.3"},
		{"Forwarded: unknown client: the peer", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=6.6.6.6, for=unknown"), "10.0.0.1"},
		{"Forwarded: element without for", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=6.6.6.6, proto=https"), "10.0.0.1"},
		{"Forwarded: two for= in an element", fwd, ipRequest("10.0.0.1:1", "Forwarded", "for=198.51.100.1;for=6.6.6.6"), "10.0.0.1"},
		{"Forwarded: the client's open quote cannot swallow the proxy's entry", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for="6.6.6.6, for=198.51.100.1`), "198.51.100.1"},
		{"Forwarded: escaped quotes", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for=6.6.6.6, for=198.51.100.1;x="a\\\", b\\"`), "198.51.100.1"},
		{"Forwarded: unbalanced quote", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for="198.51.100.1`), "10.0.0.1"},
		{"Forwarded: IPv6 without quotes", fwd, ipRequest("10.0.0.1:1", "Forwarded", `for=[2001:db8::1]`), "2001:db8::/64"},
		{"Forwarded: untrusted peer", fwd, ipRequest("203.0.113.9:1", "Forwarded", "for=198.51.100.1"), "203.0.113.9"},

		{"X-Real-IP from a trusted peer", real, ipRequest("10.0.0.1:1", "X-Real-IP", "198.51.100.1"), "198.51.100.1"},
		{"X-Real-IP: the last line wins", real, ipRequest("10.0.0.1:1", "X-Real-IP", "6.6.6.6", "X-Real-IP", "198.51.100.1"), "198.51.100.1"},
		{"X-Real-IP from an untrusted peer", real, ipRequest("10.0.0.2:1", "X-Real-IP", "198.51.100.1"), "10.0.0.2"},
		{"X-Real-IP malformed: the peer", real, ipRequest("10.0.0.1:1", "X-Real-IP", "198.51.100"), "10.0.0.1"},
		{"X-Real-IP ignores XFF", real, ipRequest("10.0.0.1:1", "X-Forwarded-For", "198.51.100.1"), "10.0.0.1"},
	} {
		if got := mustKey(t, tc.fn, tc.r); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRandomXForwardedForBuysNoQuota is the spoofing regression: a client that
// sends a fresh X-Forwarded-For on every request stays on one budget, whether
// it connects directly or behind one or two trusted proxies.
func TestRandomXForwardedForBuysNoQuota(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fn      KeyFunc
		peer    string
		appends string // what the trusted proxies append after the client's value
	}{
		{"no proxy", MustClientIP(), "203.0.113.9:1", ""},
		{"no proxy, trust configured", MustClientIP(TrustXForwardedFor("10.0.0.0/8")), "203.0.113.9:1", ""},
		{"one proxy", MustClientIP(TrustXForwardedFor("10.0.0.0/8")), "10.0.0.1:1", ", 203.0.113.9"},
		{"two proxies", MustClientIP(TrustXForwardedFor("10.0.0.0/8")), "10.0.0.1:1", ", 203.0.113.9, 10.0.0.2"},
		{"two proxies, Forwarded", MustClientIP(TrustForwarded("10.0.0.0/8")), "10.0.0.1:1", ", for=203.0.113.9, for=10.0.0.2"},
	} {
		be := &quota{}
		h := MustNew([]Rule{{Name: "ip", Key: tc.fn, Limit: 3, Period: time.Minute}}, WithBackend(be)).Handler(okHandler)
		header := "X-Forwarded-For"
		if strings.Contains(tc.appends, "for=") {
			header = "Forwarded"
		}
		var reqs []*http.Request
		for range 6 {
			spoof := fmt.Sprintf("%d.%d.%d.%d", rand.IntN(223)+1, rand.IntN(256), rand.IntN(256), rand.IntN(256))
			if header == "Forwarded" {
				spoof = "for=" + spoof
			}
			reqs = append(reqs, ipRequest(tc.peer, header, spoof+tc.appends))
		}
		if got, want := statuses(t, h, reqs...), []int{200, 200, 200, 429, 429, 429}; !equalInts(got, want) {
			t.Errorf("%s: statuses %v, want %v", tc.name, got, want)
		}
	}
}

func TestClientIPConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		opts []IPOption
		want string
	}{
		{[]IPOption{TrustXForwardedFor("10.0.0.0/33")}, `"10.0.0.0/33"`},
		{[]IPOption{TrustXForwardedFor("proxy.internal")}, `"proxy.internal"`},
		{[]IPOption{TrustForwarded()}, "no trusted proxies"},
		{[]IPOption{TrustXForwardedFor("10.0.0.1"), TrustForwarded("10.0.0.1")}, "already trusting X-Forwarded-For"},
		{[]IPOption{TrustXRealIP("fe80::1%eth0")}, "zones"},
		{[]IPOption{TrustXForwardedFor("0.0.0.0/0")}, "trusts every address"},
		{[]IPOption{TrustXForwardedFor("::ffff:0.0.0.0/96")}, "trusts every address"},
		{[]IPOption{IPv6Prefix(0)}, "IPv6Prefix(0)"},
		{[]IPOption{nil}, "nil option"},
	} {
		_, err := ClientIP(tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "ceiling: ") {
			t.Errorf("error %v, want one naming %s", err, tc.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustClientIP did not panic on a bad prefix")
		}
	}()
	MustClientIP(TrustXForwardedFor("nope"))
}

// An IPv4-mapped trusted prefix must match the plain IPv4 peers it names,
// else the proxy would be taken for the client.
func TestMappedTrustedPrefixMatchesIPv4Peers(t *testing.T) {
	fn := MustClientIP(TrustXForwardedFor("::ffff:10.0.0.0/104"))
	if got, want := mustKey(t, fn, ipRequest("10.9.9.9:1", "X-Forwarded-For", "198.51.100.1")), "198.51.100.1"; got != want {
		t.Errorf("key %q, want %q", got, want)
	}
}

func BenchmarkClientIP(b *testing.B) {
	for _, bc := range []struct {
		name string
		fn   KeyFunc
		r    *http.Request
	}{
		{"peer", MustClientIP(), ipRequest("203.0.113.9:1", "X-Forwarded-For", "1.1.1.1")},
		{"xff=3", MustClientIP(TrustXForwardedFor(PrivateRanges()...)), ipRequest("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, 203.0.113.9, 10.0.0.2")},
		{"forwarded=3", MustClientIP(TrustForwarded(PrivateRanges()...)), ipRequest("10.0.0.1:1", "Forwarded", `for=6.6.6.6, for="[2001:db8::1]:80", for=10.0.0.2`)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.fn(bc.r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
