package client

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func TestRetryAfterForms(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 120 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"0", 0, true},
		{"007", 7 * time.Second, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true}, // one past the longest Duration: saturates
		{"99999999999999999999999999999", math.MaxInt64, true},
		{"Tue, 01 Dec 2026 12:00:30 GMT", 30 * time.Second, true},   // IMF-fixdate
		{"Tuesday, 01-Dec-26 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Tue Dec  1 12:00:30 2026", 30 * time.Second, true},        // asctime
		{"Fri, 31 Dec 1999 23:59:59 GMT", 0, true},                  // past: now
		{"Tue, 01 Dec 2026 12:00:00 GMT", 0, true},
		{"", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"0x10", 0, false},
		{"soon", 0, false},
		{"Tue, 01 Dec 2026 12:00:30 UTC", 0, false}, // time.RFC1123 with "UTC" is not an HTTP-date
		{"Tue, 32 Dec 2026 12:00:30 GMT", 0, false},
		{"\x00\xff", 0, false},
	} {
		got, ok := parseRetryAfter(c.in, t0)
		if got != c.want || ok != c.ok {
			t.Errorf("Retry-After %q: %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestRateLimitMembers(t *testing.T) {
	for _, c := range []struct {
		in        []string
		exhausted time.Duration // -1: no member with r=0 and t
	}{
		{[]string{`"chat:minute";r=0;t=42, "chat:day";r=970;t=0`}, 42 * time.Second},
		{[]string{`"a";r=0;t=5, "b";r=0;t=9`}, 9 * time.Second},
		{[]string{`"a";r=3;t=0`}, -1},
		{[]string{`"a";r=0;t=5`, `"b";r=0;t=8`}, 8 * time.Second}, // over two lines
		{[]string{`default;r=0;t=5`}, 5 * time.Second},            // a token, not a string
		{[]string{`"a, \"b\"; c";r=0;t=6`}, 6 * time.Second},      // commas and quotes inside the string
		{[]string{` "a" ; r=0 ; t=7 `}, 7 * time.Second},
		{[]string{`"a";pk=:AAE=:;r=0;t=4`}, 4 * time.Second}, // a parameter not ours
		{[]string{`"a";t=4`}, -1},
		{[]string{`"a";r=0`}, -1},
		{[]string{`"a";r=0;t=-5`}, -1},
		{[]string{`"a";r=-1;t=5`}, -1},
		{[]string{`"a";r=0;t=5.5`}, -1},
		{[]string{`"a";r=0;t`}, -1},
		{[]string{`"a;r=0;t=5`}, -1},                        // unterminated string
		{[]string{`"a";r=0;t=5 junk`}, -1},                  // trailing bytes
		{[]string{`garbage, "b";r=0;t=3`}, 3 * time.Second}, // one bad member hides no other
		{[]string{`=;=;, ,,;;"`}, -1},
		{[]string{`"a";r=0;t=99999999999999999999999`}, math.MaxInt64},
		{nil, -1},
	} {
		q := parseRateLimit(c.in)
		got := time.Duration(-1)
		if q.exhausted {
			got = q.exhaustedWait
		}
		if got != c.exhausted {
			t.Errorf("RateLimit %q: wait %v, want %v", c.in, got, c.exhausted)
		}
	}
}

// A huge field is read in one linear pass and its members all count.
func TestRateLimitHugeField(t *testing.T) {
	var b strings.Builder
	for i := range 100_000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"p` + strconv.Itoa(i) + `";r=1;t=0`)
	}
	b.WriteString(`, "last";r=0;t=11`)
	q := parseRateLimit([]string{b.String()})
	if !q.exhausted || q.exhaustedWait != 11*time.Second {
		t.Errorf("exhausted %v after %v, want the last member's 11s", q.exhausted, q.exhaustedWait)
	}
}

// FuzzRetryWait: no input panics or gives a negative wait; a parsed
// delta-seconds value is what was written; and the RateLimit t comes in
// only when Retry-After does not parse.
func FuzzRetryWait(f *testing.F) {
	for _, s := range []string{
		"120", "-1", "Fri, 31 Dec 1999 23:59:59 GMT", `"a";r=0;t=5`, `"a";r=0;t=5, "b";r=1;t=0`,
		`"unterminated`, `;;;`, "99999999999999999999", "\\\"\\", "",
	} {
		f.Add(s, `"api";r=0;t=3`)
		f.Add("", s)
	}
	f.Fuzz(func(t *testing.T, retryAfter, rateLimit string) {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		if rateLimit != "" {
			h.Set("Ratelimit", rateLimit)
		}
		wait, ok := retryWait(h, t0)
		if wait < 0 || !ok && wait != 0 {
			t.Fatalf("retryWait = %v, %v", wait, ok)
		}
		ra, raOK := parseRetryAfter(retryAfter, t0)
		if raOK && (!ok || wait != ra) {
			t.Fatalf("Retry-After %q parses to %v, but the wait is %v, %v", retryAfter, ra, wait, ok)
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(retryAfter), 10, 64); err == nil && n >= 0 &&
			!strings.ContainsAny(retryAfter, "+-") && n <= maxSeconds && wait != time.Duration(n)*time.Second {
			t.Fatalf("Retry-After %q gave %v", retryAfter, wait)
		}
		q := parseRateLimit([]string{rateLimit})
		if !raOK && ok != q.exhausted {
			t.Fatalf("no Retry-After, RateLimit %q has a spent quota: %v, but ok = %v", rateLimit, q.exhausted, ok)
		}
	})
}

// A member with a huge number of parameters is read in one linear pass
// too (the field is the server's, or a proxy's, to make as large as its
// header limit allows).
func TestRateLimitHugeMember(t *testing.T) {
	m := `"a"` + strings.Repeat(";x=1", 200_000) + ";r=0;t=11"
	q := parseRateLimit([]string{m})
	if !q.exhausted || q.exhaustedWait != 11*time.Second {
		t.Errorf("exhausted %v after %v, want 11s from the last parameters", q.exhausted, q.exhaustedWait)
	}
}
