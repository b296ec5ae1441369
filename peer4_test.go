package ceiling

import "testing"

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
