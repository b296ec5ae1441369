package client

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// maxSeconds is the most delta-seconds a time.Duration holds; a longer
// wait saturates there instead of overflowing into a negative one.
const maxSeconds = int64(math.MaxInt64 / time.Second)

// retryWait is how long a refusal with header h asks its client to wait
// before sending the request again, read at now: Retry-After
// (delta-seconds or an HTTP-date, RFC 9110 section 10.2.3) when it parses,
// else the largest t of the RateLimit field's members that have no units
// left (r=0, draft-ietf-httpapi-ratelimit-headers-11). ok is false when h
// says neither, or says it in a form that does not parse: a client that
// guesses a wait it was not given only adds rejected calls. A member with
// units left says nothing about this refusal (its t is 0).
func retryWait(h http.Header, now time.Time) (wait time.Duration, ok bool) {
	if v := h.Values("Retry-After"); len(v) > 0 {
		if d, ok := parseRetryAfter(v[0], now); ok {
			return d, true
		}
	}
	if q := parseRateLimit(h.Values("Ratelimit")); q.exhausted {
		return q.exhaustedWait, true
	}
	return 0, false
}

// parseRetryAfter reads one Retry-After value: delta-seconds (digits only,
// so "-5" and "1.5" are refused), saturated at the longest Duration, or an
// HTTP-date in any of the three forms RFC 9110 requires a recipient to
// accept, of which a past one means "now".
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if n, ok := parseDigits(v); ok {
		return seconds(n), true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// seconds is n seconds as a Duration, saturated.
func seconds(n int64) time.Duration {
	if n > maxSeconds {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

// parseDigits parses a non-empty run of ASCII digits, saturating at
// math.MaxInt64 rather than failing on a huge value.
func parseDigits(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxInt64-int64(c-'0'))/10 {
			n = math.MaxInt64
			continue
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// quotas is what a RateLimit field says about waiting.
type quotas struct {
	exhausted     bool          // some member has r=0 and a t
	exhaustedWait time.Duration // the largest t of those
	name          string        // the member with that t, as sent
	fewest        int64         // the smallest r of any member; -1 when none has one
	seen          bool          // some member parsed, with or without r and t
}

// parseRateLimit reads the RateLimit field's members, one
// `"policy";r=REMAINING;t=SECONDS` each (an HTTP Structured Fields list,
// RFC 9651, possibly over several lines). A member that does not parse, or
// whose r or t is not a non-negative integer, is skipped on its own: one
// bad member from a proxy does not hide the others. The scan is linear in
// the field's length.
func parseRateLimit(lines []string) quotas {
	q := quotas{fewest: -1}
	for _, line := range lines {
		for line != "" {
			var member string
			member, line = nextMember(line)
			name, p, ok := parseMember(member)
			if !ok {
				continue
			}
			q.seen = true
			if p.r >= 0 && (q.fewest < 0 || p.r < q.fewest) {
				q.fewest = p.r
			}
			if p.r == 0 && p.t >= 0 && (!q.exhausted || seconds(p.t) > q.exhaustedWait) {
				q.exhausted = true
				q.exhaustedWait = seconds(p.t)
				q.name = name
			}
		}
	}
	return q
}

// parsePolicy reads the q and w of the RateLimit-Policy member called name
// (`"policy";q=QUOTA;w=SECONDS`): how many units the quota holds after
// each reset, and how far apart its resets are. ok is false when no such
// member parses with a q and a w above 0.
func parsePolicy(lines []string, name string) (quota int64, window time.Duration, ok bool) {
	for _, line := range lines {
		for line != "" {
			var member string
			member, line = nextMember(line)
			if n, p, good := parseMember(member); good && n == name && p.q > 0 && p.w > 0 {
				return p.q, seconds(p.w), true
			}
		}
	}
	return 0, 0, false
}

// nextMember splits s at its first comma outside a quoted string.
func nextMember(s string) (member, rest string) {
	if i := indexUnquoted(s, ','); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// indexUnquoted is the index of s's first sep outside a quoted string, or
// -1: a parameter's string value may hold commas and semicolons.
func indexUnquoted(s string, sep byte) int {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte is part of the string
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			return i
		}
	}
	return -1
}

// params are a member's integer parameters, each -1 when absent: r and t
// in RateLimit, q and w in RateLimit-Policy.
type params struct{ r, t, q, w int64 }

// parseMember reads one member's item (its name, as sent) and its r, t, q
// and w parameters. ok is false when the member is empty, its item is not
// a string or token, a string is unterminated, or one of those parameters
// is present but is not a non-negative integer.
func parseMember(m string) (name string, p params, ok bool) {
	m = strings.TrimSpace(m)
	if m == "" {
		return "", p, false
	}
	var rest string
	if m[0] == '"' {
		end := closingQuote(m)
		if end < 0 {
			return "", p, false
		}
		name, rest = m[:end+1], m[end+1:]
	} else {
		i := strings.IndexByte(m, ';')
		if i < 0 {
			i = len(m)
		}
		name, rest = strings.TrimSpace(m[:i]), m[i:]
		if !isToken(name) {
			return "", p, false
		}
	}
	p = params{r: -1, t: -1, q: -1, w: -1}
	for rest = strings.TrimSpace(rest); rest != ""; {
		if rest[0] != ';' {
			return "", p, false
		}
		// Slicing, never concatenating: the scan stays linear however
		// many parameters a member has.
		param := rest[1:]
		if i := indexUnquoted(param, ';'); i >= 0 {
			param, rest = param[:i], param[i:]
		} else {
			rest = ""
		}
		key, val, hasVal := strings.Cut(strings.TrimSpace(param), "=")
		var dst *int64
		switch key {
		case "r":
			dst = &p.r
		case "t":
			dst = &p.t
		case "q":
			dst = &p.q
		case "w":
			dst = &p.w
		default:
			continue // pk, qu, a future parameter: not ours to judge
		}
		n, good := parseDigits(val)
		if !hasVal || !good {
			return "", p, false
		}
		*dst = n
	}
	return name, p, true
}

// closingQuote is the index of the quote that ends the string starting
// at m[0], or -1 when there is none.
func closingQuote(m string) int {
	for i := 1; i < len(m); i++ {
		switch m[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// isToken reports whether s is a non-empty Structured Fields token's
// worth of printable, unquoted bytes.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == ',' || c == ';' || c == '=' {
			return false
		}
	}
	return true
}
