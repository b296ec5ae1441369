package ceiling

import (
	"net/netip"
	"strings"
	"testing"
)

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
