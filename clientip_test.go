package ceiling

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
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
	for name, fn := range map[string]KeyFunc{"ClientIP()": Must(ClientIP()), "RemoteAddr": RemoteAddr} {
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
		if got := mustKey(t, Must(ClientIP(tc.opts...)), ipRequest(tc.peer)); got != tc.want {
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
	fn := Must(ClientIP())
	first := mustKey(t, fn, ipRequest("[2001:db8:aa:bb::1]:1"))
	for i := range 50 {
		peer := fmt.Sprintf("[2001:db8:aa:bb:%x:%x:%x:%x]:1", rand.Uint32()&0xffff, rand.Uint32()&0xffff, i, rand.Uint32()&0xffff)
		if got := mustKey(t, fn, ipRequest(peer)); got != first {
			t.Fatalf("%s keyed %q, %q for the same /64", peer, got, first)
		}
	}
}

func TestClientIPBehindTrustedProxies(t *testing.T) {
	// Some cases come from private peers that the key does not trust: keep
	// the process-wide report they raise to this test.
	resetUntrustedProxy(t, &bytes.Buffer{})
	xff := Must(ClientIP(TrustXForwardedFor("10.0.0.0/8", "2001:db8:ffff::/48")))
	fwd := Must(ClientIP(TrustForwarded("10.0.0.0/8")))
	real := Must(ClientIP(TrustHeader("X-Real-IP", "10.0.0.1")))
	private := Must(ClientIP(TrustXForwardedFor(PrivateRanges()...)))
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

// TestClientIPByHopCount: behind n proxies whose addresses are not known,
// the client is the n-th entry from the right, whoever the peer is.
func TestClientIPByHopCount(t *testing.T) {
	one := Must(ClientIP(TrustXForwardedForHops(1)))
	two := Must(ClientIP(TrustXForwardedForHops(2)))
	fwd2 := Must(ClientIP(TrustForwardedHops(2)))
	for _, tc := range []struct {
		name string
		fn   KeyFunc
		r    *http.Request
		want string
	}{
		{"one proxy: the right-most", one, ipRequest("198.18.0.1:1", "X-Forwarded-For", "6.6.6.6, 198.51.100.1"), "198.51.100.1"},
		{"one proxy, peer anywhere", one, ipRequest("203.0.113.5:1", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"two proxies", two, ipRequest("198.18.0.1:1", "X-Forwarded-For", "6.6.6.6, 7.7.7.7, 198.51.100.1, 198.18.0.2"), "198.51.100.1"},
		{"two proxies, lines concatenate", two, ipRequest("198.18.0.1:1", "X-Forwarded-For", "6.6.6.6, 198.51.100.1", "X-Forwarded-For", "198.18.0.2"), "198.51.100.1"},
		{"two proxies, with ports and IPv6", two, ipRequest("198.18.0.1:1", "X-Forwarded-For", "[2001:db8:1:2::9]:443, 198.18.0.2:80"), "2001:db8:1:2::/64"},
		{"fewer entries than proxies: the left-most", two, ipRequest("198.18.0.1:1", "X-Forwarded-For", "198.51.100.1"), "198.51.100.1"},
		{"no header: the peer", two, ipRequest("198.18.0.1:1"), "198.18.0.1"},
		{"garbage at the client's place: the hop to its right", two, ipRequest("198.18.0.1:1", "X-Forwarded-For", "6.6.6.6, unknown, 198.18.0.2"), "198.18.0.2"},
		{"garbage everywhere: the peer", one, ipRequest("198.18.0.1:1", "X-Forwarded-For", "198.51.100.1, <script>"), "198.18.0.1"},
		{"client garbage left of the count: never read", one, ipRequest("198.18.0.1:1", "X-Forwarded-For", `"<x>, 198.51.100.1`), "198.51.100.1"},
		{"Forwarded ignored by an XFF count", one, ipRequest("198.18.0.1:1", "Forwarded", "for=198.51.100.1"), "198.18.0.1"},

		{"Forwarded: two proxies", fwd2, ipRequest("198.18.0.1:1", "Forwarded", `for=6.6.6.6, for="198.51.100.1:4711";proto=https, for=198.18.0.2`), "198.51.100.1"},
		{"Forwarded: client's open quote cannot move the count", fwd2, ipRequest("198.18.0.1:1", "Forwarded", `for="6.6.6.6, for=198.51.100.1, for=198.18.0.2`), "198.51.100.1"},
		{"Forwarded: obfuscated client: the hop to its right", fwd2, ipRequest("198.18.0.1:1", "Forwarded", "for=_hidden, for=198.18.0.2"), "198.18.0.2"},
	} {
		if got := mustKey(t, tc.fn, tc.r); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestClientIPFromANamedHeader: a single-address header (CDNs and platforms)
// read from trusted ranges only, or from anywhere when asked explicitly.
func TestClientIPFromANamedHeader(t *testing.T) {
	cf := Must(ClientIP(TrustHeader("cf-connecting-ip", "173.245.48.0/20", "2400:cb00::/32")))
	fly := Must(ClientIP(TrustHeaderFromAnywhere("Fly-Client-IP")))
	for _, tc := range []struct {
		name string
		fn   KeyFunc
		r    *http.Request
		want string
	}{
		{"from the CDN's range", cf, ipRequest("173.245.48.7:1", "CF-Connecting-IP", "198.51.100.1"), "198.51.100.1"},
		{"from the CDN's IPv6 range", cf, ipRequest("[2400:cb00::7]:1", "CF-Connecting-IP", "2001:db8:1:2::9"), "2001:db8:1:2::/64"},
		{"a client sending it directly: ignored", cf, ipRequest("203.0.113.9:1", "CF-Connecting-IP", "198.51.100.1"), "203.0.113.9"},
		{"missing: the peer", cf, ipRequest("173.245.48.7:1"), "173.245.48.7"},
		{"a list is not one address: the peer", cf, ipRequest("173.245.48.7:1", "CF-Connecting-IP", "6.6.6.6, 198.51.100.1"), "173.245.48.7"},
		{"other headers ignored", cf, ipRequest("173.245.48.7:1", "X-Forwarded-For", "198.51.100.1", "X-Real-IP", "198.51.100.2"), "173.245.48.7"},
		{"from anywhere", fly, ipRequest("203.0.113.9:1", "Fly-Client-IP", "198.51.100.1"), "198.51.100.1"},
		{"from anywhere, the last line wins", fly, ipRequest("203.0.113.9:1", "Fly-Client-IP", "6.6.6.6", "Fly-Client-IP", "198.51.100.1"), "198.51.100.1"},
		{"from anywhere, malformed: the peer", fly, ipRequest("203.0.113.9:1", "Fly-Client-IP", "nope"), "203.0.113.9"},
		{"from anywhere, missing: the peer", fly, ipRequest("203.0.113.9:1", "True-Client-IP", "198.51.100.1"), "203.0.113.9"},
	} {
		if got := mustKey(t, tc.fn, tc.r); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestIPv6RotationInsideTheConfiguredPrefixBuysNothing pins issue 14's sixth
// finding: with the prefix an ISP assigns (/56, /48), every address of it,
// in any of its /64s, spends one budget; the next prefix has its own.
func TestIPv6RotationInsideTheConfiguredPrefixBuysNothing(t *testing.T) {
	for _, tc := range []struct {
		bits        int
		inside      func(i int) string // an address in 2001:db8:aa00::/bits
		nextPrefix  string
		defaultKeys int // distinct budgets the default /64 would have given
	}{
		{56, func(i int) string { return fmt.Sprintf("2001:db8:aa00:%x:%x::%x", i%256, rand.Uint32()&0xffff, i) }, "2001:db8:aa00:100::1", 22},
		{48, func(i int) string {
			return fmt.Sprintf("2001:db8:aa00:%x::%x", uint32(i)<<8|rand.Uint32()&0xff, i) // a distinct /64 for each i
		}, "2001:db8:aa01::1", 22},
	} {
		key := Must(ClientIP(IPv6Prefix(tc.bits)))
		h := MustNew([]Rule{{Name: "ip", Key: key, Limit: 3, Period: time.Hour}}, WithBackend(&quota{})).Handler(okHandler)
		var reqs []*http.Request
		seen64 := map[string]bool{}
		for i := range 22 {
			a := tc.inside(i + 1)
			seen64[mustKey(t, RemoteAddr, ipRequest("["+a+"]:1"))] = true
			reqs = append(reqs, ipRequest("["+a+"]:1"))
		}
		got := statuses(t, h, reqs...)
		if want := append([]int{200, 200, 200}, slices.Repeat([]int{429}, 19)...); !slices.Equal(got, want) {
			t.Errorf("/%d: 22 addresses in one prefix: %v, want 3 admitted", tc.bits, got)
		}
		if len(seen64) < tc.defaultKeys {
			t.Errorf("/%d: the addresses span %d /64s, want %d (else the test shows nothing)", tc.bits, len(seen64), tc.defaultKeys)
		}
		if got := statuses(t, h, ipRequest("["+tc.nextPrefix+"]:1")); got[0] != 200 {
			t.Errorf("/%d: the next prefix %s: %d, want 200 (a budget of its own)", tc.bits, tc.nextPrefix, got[0])
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
		{"no proxy", Must(ClientIP()), "203.0.113.9:1", ""},
		{"no proxy, trust configured", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), "203.0.113.9:1", ""},
		{"one proxy", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), "10.0.0.1:1", ", 203.0.113.9"},
		{"two proxies", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), "10.0.0.1:1", ", 203.0.113.9, 10.0.0.2"},
		{"two proxies, Forwarded", Must(ClientIP(TrustForwarded("10.0.0.0/8"))), "10.0.0.1:1", ", for=203.0.113.9, for=10.0.0.2"},
		{"one hop", Must(ClientIP(TrustXForwardedForHops(1))), "198.18.0.1:1", ", 203.0.113.9"},
		{"two hops", Must(ClientIP(TrustXForwardedForHops(2))), "198.18.0.1:1", ", 203.0.113.9, 198.18.0.2"},
		{"two hops, Forwarded", Must(ClientIP(TrustForwardedHops(2))), "198.18.0.1:1", ", for=203.0.113.9, for=198.18.0.2"},
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
		if got, want := statuses(t, h, reqs...), []int{200, 200, 200, 429, 429, 429}; !slices.Equal(got, want) {
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
		{[]IPOption{TrustHeader("X-Real-IP", "fe80::1%eth0")}, "zones"},
		{[]IPOption{TrustXForwardedFor("0.0.0.0/0")}, "trusts every address"},
		{[]IPOption{TrustXForwardedFor("::ffff:0.0.0.0/96")}, "trusts every address"},
		{[]IPOption{IPv6Prefix(0)}, "IPv6Prefix(0)"},
		{[]IPOption{TrustXForwardedForHops(0)}, "TrustXForwardedForHops(0)"},
		{[]IPOption{TrustForwardedHops(33)}, "TrustForwardedHops(33)"},
		{[]IPOption{TrustXForwardedForHops(1), TrustXForwardedFor("10.0.0.1")}, "already trusting X-Forwarded-For (TrustXForwardedForHops)"},
		{[]IPOption{TrustXForwardedFor("10.0.0.1"), TrustXForwardedForHops(1)}, "already trusting X-Forwarded-For (TrustXForwardedFor)"},
		{[]IPOption{TrustHeader("CF-Connecting-IP", "10.0.0.1"), TrustHeader("True-Client-IP", "10.0.0.1")}, "already trusting Cf-Connecting-Ip"},
		{[]IPOption{TrustHeader("CF-Connecting-IP", "10.0.0.1"), TrustHeaderFromAnywhere("CF-Connecting-IP")}, "already trusting Cf-Connecting-Ip (TrustHeader)"},
		{[]IPOption{TrustHeader("")}, "no header name"},
		{[]IPOption{TrustHeader("X-Real-IP")}, "no trusted proxies"},
		{[]IPOption{TrustHeaderFromAnywhere("x-forwarded-for")}, "a list header"},
		{[]IPOption{TrustHeader("CF-Connecting-IP", "0.0.0.0/0")}, "trusts every address"},
		{[]IPOption{nil}, "nil option"},
	} {
		_, err := ClientIP(tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "ceiling: ") {
			t.Errorf("error %v, want one naming %s", err, tc.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Must did not panic on a bad prefix")
		}
	}()
	Must(ClientIP(TrustXForwardedFor("nope")))
}

// An IPv4-mapped trusted prefix must match the plain IPv4 peers it names,
// else the proxy would be taken for the client.
func TestMappedTrustedPrefixMatchesIPv4Peers(t *testing.T) {
	fn := Must(ClientIP(TrustXForwardedFor("::ffff:10.0.0.0/104")))
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
		{"peer", Must(ClientIP()), ipRequest("203.0.113.9:1", "X-Forwarded-For", "1.1.1.1")},
		{"xff=3", Must(ClientIP(TrustXForwardedFor(PrivateRanges()...))), ipRequest("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, 203.0.113.9, 10.0.0.2")},
		{"forwarded=3", Must(ClientIP(TrustForwarded(PrivateRanges()...))), ipRequest("10.0.0.1:1", "Forwarded", `for=6.6.6.6, for="[2001:db8::1]:80", for=10.0.0.2`)},
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

// resetUntrustedProxy forgets the process-wide report, sends the next one's
// log line to logs, and restores the process's state when the test ends.
func resetUntrustedProxy(t *testing.T, logs *bytes.Buffer) {
	t.Helper()
	saved := processLogger.Load()
	clear := func() {
		untrustedProxy.reported.Store(false)
		untrustedProxy.warning.Store(nil)
	}
	clear()
	processLogger.Store(slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() {
		clear()
		processLogger.Store(saved)
	})
}

// TestUntrustedProxyIsReported pins issue 17's misconfiguration check: a
// private-range peer sending X-Forwarded-For to a key that does not trust it
// is logged once per process with the fix, and shown in every limiter's
// health warnings; public peers, trusted proxies and requests without the
// header raise nothing.
func TestUntrustedProxyIsReported(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  KeyFunc
		r    *http.Request
		fix  string // "" when nothing must be reported
	}{
		{"RemoteAddr behind a load balancer", RemoteAddr, ipRequest("10.0.3.7:1", "X-Forwarded-For", "198.51.100.1"), "TrustXForwardedFor(its address range)"},
		{"RemoteAddr behind a local proxy, Forwarded", RemoteAddr, ipRequest("[::1]:1", "Forwarded", "for=198.51.100.1"), "TrustForwarded(its address range)"},
		{"a load balancer outside the trusted range", Must(ClientIP(TrustXForwardedFor("10.0.0.0/16"))), ipRequest("10.1.0.1:1", "X-Forwarded-For", "198.51.100.1"), "add its address range to TrustXForwardedFor"},
		{"a CDN header from an untrusted private peer", Must(ClientIP(TrustHeader("CF-Connecting-IP", "173.245.48.0/20"))), ipRequest("192.168.1.9:1", "CF-Connecting-IP", "198.51.100.1"), "add its address range to TrustHeader"},

		{"a public client forging the header", RemoteAddr, ipRequest("203.0.113.9:1", "X-Forwarded-For", "198.51.100.1"), ""},
		{"a private peer without the header", RemoteAddr, ipRequest("10.0.3.7:1"), ""},
		{"a trusted proxy", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), ipRequest("10.0.3.7:1", "X-Forwarded-For", "198.51.100.1"), ""},
		{"a trusted proxy with a garbage entry", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), ipRequest("10.0.3.7:1", "X-Forwarded-For", "nope"), ""},
		{"another header than the one trusted", Must(ClientIP(TrustXForwardedFor("10.0.0.0/16"))), ipRequest("10.1.0.1:1", "Forwarded", "for=198.51.100.1"), ""},
		{"hop count", Must(ClientIP(TrustXForwardedForHops(1))), ipRequest("10.0.3.7:1", "X-Forwarded-For", "garbage"), ""},
	} {
		var logs bytes.Buffer
		resetUntrustedProxy(t, &logs)
		l := MustNew([]Rule{{Name: "ip", Key: tc.key, Limit: 100, Period: time.Minute}}, WithLogger(slog.New(slog.DiscardHandler)))
		other := MustNew([]Rule{{Name: "other", Key: Static("x"), Limit: 1, Period: time.Minute}})
		h := l.Handler(okHandler)
		for range 3 {
			serve(t, h, tc.r.Clone(tc.r.Context()))
		}
		got := strings.Count(logs.String(), "level=WARN")
		warnings := slices.Concat(l.Health().Warnings, other.Health().Warnings)
		if tc.fix == "" {
			if got != 0 || len(warnings) != 0 {
				t.Errorf("%s: %d warnings logged, health %q; want none:\n%s", tc.name, got, warnings, logs.String())
			}
		} else {
			peer, _, _ := net.SplitHostPort(tc.r.RemoteAddr)
			if log := logs.String(); got != 1 || !strings.Contains(log, tc.fix) || !strings.Contains(log, "requests from "+peer) {
				t.Errorf("%s: %d warnings logged, want 1 naming %s and the fix %q:\n%s", tc.name, got, peer, tc.fix, log)
			}
			if len(warnings) != 2 || warnings[0] != warnings[1] || !strings.Contains(warnings[0], tc.fix) || strings.Contains(warnings[0], peer) {
				t.Errorf("%s: health warnings %q, want the fix on both limiters, without the peer's address", tc.name, warnings)
			}
		}
		l.Close()
		other.Close()
	}
}

// peer4 is RemoteAddr's fast path: whenever it answers, it must answer what
// net.SplitHostPort and netip.ParseAddr (peerHost, normalAddr) would.
func checkPeer4(t *testing.T, s string) (ok bool) {
	t.Helper()
	host, a, ok := peer4(s)
	if !ok {
		return false
	}
	wantHost := peerHost(s)
	want, wantOK := normalAddr(wantHost)
	if !wantOK || host != wantHost || a != want {
		t.Fatalf("peer4(%q) = %q, %v; the slow path says %q, %v (ok %v)", s, host, a, wantHost, want, wantOK)
	}
	return true
}

func TestPeer4AgreesWithTheSlowPath(t *testing.T) {
	for _, s := range []string{"203.0.113.9:4711", "10.0.0.1:1", "0.0.0.0:0", "255.255.255.255:65535", "1.2.3.4:"} {
		if !checkPeer4(t, s) {
			t.Errorf("peer4(%q) declined a canonical IPv4 address and port", s)
		}
	}
	for _, s := range []string{
		"", "1.2.3.4", "1.2.3:4", "1.2.3.4.5:6", "01.2.3.4:5", "1.2.3.00:5", "256.1.1.1:1", "1.2.3.4:5:6",
		"1.2.3.4:[", "1.2.3.4:]", "[1.2.3.4]:5", "::ffff:1.2.3.4:5", "1.2.3.4%eth0:5", " 1.2.3.4:5", "1..2.3:4",
		"1.2.3.1000:5", "a.b.c.d:1", "1.2.3.4 :5",
	} {
		if checkPeer4(t, s) {
			t.Errorf("peer4(%q) answered; only the slow path may judge it", s)
		}
	}
}

func FuzzPeer4(f *testing.F) {
	for _, s := range []string{"203.0.113.9:4711", "1.2.3.4", "01.2.3.4:5", "1.2.3.4:5:6", "[::1]:80", "1.2.3.4:]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkPeer4(t, s) })
}

// validIPKey reports whether k is what ClientIP may return for a parseable
// peer: an address or a prefix, never raw header text.
func validIPKey(k string) bool {
	if _, err := netip.ParseAddr(k); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(k)
	return err == nil
}

func fuzzProxyHeader(f *testing.F, header string, fn KeyFunc, client string) {
	f.Fuzz(func(t *testing.T, spoof string) {
		// A client that reaches the server directly is its peer, whatever it sends.
		direct := ipRequest("203.0.113.9:1", header, spoof)
		if got, err := fn(direct); err != nil || got != "203.0.113.9" {
			t.Fatalf("direct client with %s %q: key %q, %v; want the peer", header, spoof, got, err)
		}
		// Behind the trusted proxy the key is an address, never header text.
		proxied := ipRequest("10.0.0.1:1", header, spoof)
		got, err := fn(proxied)
		if err != nil || !validIPKey(got) {
			t.Fatalf("%s %q: key %q, %v", header, spoof, got, err)
		}
		// Whatever the client wrote, the entry the proxy appended decides.
		appended := ipRequest("10.0.0.1:1", header, spoof+", "+client)
		if got, err := fn(appended); err != nil || got != "198.51.100.1" {
			t.Fatalf("%s %q + proxy's entry: key %q, %v; want 198.51.100.1", header, spoof, got, err)
		}
		if strings.ContainsAny(spoof, "\r\n") {
			return
		}
		// So does a separate line the proxy added.
		twoLines := ipRequest("10.0.0.1:1", header, spoof, header, client)
		if got, err := fn(twoLines); err != nil || got != "198.51.100.1" {
			t.Fatalf("%s lines %q, %q: key %q, %v", header, spoof, client, got, err)
		}
	})
}

func FuzzXForwardedFor(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "1.2.3.4, 10.0.0.2", "[::1]:80", "::ffff:10.0.0.3", "fe80::1%eth0", ",,,", " , 10.0.0.9"} {
		f.Add(s)
	}
	fuzzProxyHeader(f, "X-Forwarded-For", Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))), "198.51.100.1")
}

func FuzzForwarded(f *testing.F) {
	for _, s := range []string{"", "for=1.2.3.4", `for="[2001:db8::1]:80"`, "for=_hidden", "for=unknown", `for="a,b`, `for=1.2.3.4;by=10.0.0.1, for=10.0.0.2`, `x="\"`} {
		f.Add(s)
	}
	fuzzProxyHeader(f, "Forwarded", Must(ClientIP(TrustForwarded("10.0.0.0/8"))), "for=198.51.100.1")
}

func FuzzXRealIP(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "[::1]:80", "::ffff:1.2.3.4", "10.0.0.1, 1.2.3.4"} {
		f.Add(s)
	}
	fn := Must(ClientIP(TrustHeader("X-Real-IP", "10.0.0.0/8")))
	f.Fuzz(func(t *testing.T, v string) {
		if got, err := fn(ipRequest("203.0.113.9:1", "X-Real-IP", v)); err != nil || got != "203.0.113.9" {
			t.Fatalf("direct X-Real-IP %q: key %q, %v", v, got, err)
		}
		if got, err := fn(ipRequest("10.0.0.1:1", "X-Real-IP", v)); err != nil || !validIPKey(got) {
			t.Fatalf("X-Real-IP %q: key %q, %v", v, got, err)
		}
	})
}

// fuzzHops checks a hop-count key: whatever the client wrote, the entries
// the two proxies appended decide, and the key is always an address.
func fuzzHops(f *testing.F, header string, fn KeyFunc, appended string) {
	f.Fuzz(func(t *testing.T, spoof string) {
		if got, err := fn(ipRequest("198.18.0.1:1", header, spoof)); err != nil || !validIPKey(got) {
			t.Fatalf("%s %q: key %q, %v", header, spoof, got, err)
		}
		if got, err := fn(ipRequest("198.18.0.1:1", header, spoof+", "+appended)); err != nil || got != "198.51.100.1" {
			t.Fatalf("%s %q + the proxies' entries: key %q, %v; want 198.51.100.1", header, spoof, got, err)
		}
		if strings.ContainsAny(spoof, "\r\n") {
			return
		}
		if got, err := fn(ipRequest("198.18.0.1:1", header, spoof, header, appended)); err != nil || got != "198.51.100.1" {
			t.Fatalf("%s lines %q, %q: key %q, %v", header, spoof, appended, got, err)
		}
	})
}

func FuzzXForwardedForHops(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "1.2.3.4, 5.6.7.8", ",,,", "unknown", `"`, "[::1]:80, fe80::1%eth0"} {
		f.Add(s)
	}
	fuzzHops(f, "X-Forwarded-For", Must(ClientIP(TrustXForwardedForHops(2))), "198.51.100.1, 198.18.0.2")
}

func FuzzForwardedHops(f *testing.F) {
	for _, s := range []string{"", "for=1.2.3.4", `for="a,b`, "for=_hidden", `x="\"`, "for=1.2.3.4;for=5.6.7.8"} {
		f.Add(s)
	}
	fuzzHops(f, "Forwarded", Must(ClientIP(TrustForwardedHops(2))), "for=198.51.100.1, for=198.18.0.2")
}

// FuzzTrustHeader: a single-address header counts only from the trusted
// range, or from anywhere when asked; the key is always an address.
func FuzzTrustHeader(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "[2001:db8::1]:443", "1.2.3.4, 5.6.7.8", "::ffff:1.2.3.4", "unknown", "fe80::1%eth0"} {
		f.Add(s)
	}
	cf := Must(ClientIP(TrustHeader("CF-Connecting-IP", "10.0.0.0/8")))
	anywhere := Must(ClientIP(TrustHeaderFromAnywhere("Fly-Client-IP")))
	f.Fuzz(func(t *testing.T, v string) {
		if got, err := cf(ipRequest("203.0.113.9:1", "CF-Connecting-IP", v)); err != nil || got != "203.0.113.9" {
			t.Fatalf("direct CF-Connecting-IP %q: key %q, %v; want the peer", v, got, err)
		}
		if got, err := cf(ipRequest("10.0.0.1:1", "CF-Connecting-IP", v)); err != nil || !validIPKey(got) {
			t.Fatalf("CF-Connecting-IP %q: key %q, %v", v, got, err)
		}
		if got, err := anywhere(ipRequest("203.0.113.9:1", "Fly-Client-IP", v)); err != nil || !validIPKey(got) {
			t.Fatalf("Fly-Client-IP %q: key %q, %v", v, got, err)
		}
	})
}
