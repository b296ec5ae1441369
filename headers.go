package ceiling

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/ceiling-go/ceiling/backend"
)

// HeaderStyle selects the rate-limit headers a response carries.
type HeaderStyle uint8

const (
	// HeadersIETF sends the IETF httpapi draft's fields: RateLimit-Policy
	// lists every enforced rule as `"name";q=LIMIT;w=SECONDS`, and RateLimit
	// each applied rule's state as `"name";r=REMAINING;t=SECONDS`, t being the
	// seconds until one more unit is available (on a 429, the rule's wait).
	HeadersIETF HeaderStyle = iota
	// HeadersRateLimit sends the widely deployed RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset (delta-seconds) of the most
	// constrained rule.
	HeadersRateLimit
	// HeadersXRateLimit sends X-RateLimit-Limit, -Remaining and -Reset of the
	// most constrained rule; Reset is the Unix time in seconds at which the
	// rule is full again, as clients of these fields parse it.
	HeadersXRateLimit
	// HeadersNone sends no rate-limit headers (Retry-After is still sent on
	// every 429).
	HeadersNone
)

// Canonical header names, assigned directly to skip canonicalisation.
const (
	hPolicy     = "Ratelimit-Policy"
	hRateLimit  = "Ratelimit"
	hRetryAfter = "Retry-After"
)

// appendPolicy appends rule r's RateLimit-Policy item at limit to b: a
// quota per window, in the rule's unit when it is not requests, or for a
// concurrency rule a number of concurrent requests, which has no window.
func appendPolicy(b []byte, r *Rule, limit int64) []byte {
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = strconv.AppendQuote(b, r.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, limit, 10)
	unit := r.Unit
	if unit == "" && r.Algorithm == Concurrency {
		unit = "concurrent-requests"
	}
	if unit != "" {
		b = append(b, `;qu="`...)
		b = append(b, unit...)
		b = append(b, '"')
	}
	if r.Algorithm == Concurrency {
		return b
	}
	b = append(b, ";w="...)
	return appendSeconds(b, r.Period)
}

// maxUnit is the longest [Rule.Unit]: the longest string a Structured
// Field parser must support (RFC 9651 §3.3.3); a parser may refuse a
// RateLimit-Policy holding a longer one.
const maxUnit = 1024

// validUnit checks a [Rule.Unit]: a name such as the draft's registered
// units, so that it is sent inside a Structured Field string unescaped,
// and one that every parser reads.
func validUnit(u string) error {
	if len(u) > maxUnit {
		return fmt.Errorf("unit of %d bytes: at most %d", len(u), maxUnit)
	}
	for i, c := range u {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' && i > 0 || c == '-' && i > 0) {
			return fmt.Errorf("unit %q: want lower-case letters, digits and '-', starting with a letter", u)
		}
	}
	return nil
}

// write sets the style's headers for d on h. A rejection shows only the
// rejecting rules' state: a 429 must not be a free way to watch a key the
// caller cannot spend (and the Redis deny cache knows no more).
func (s HeaderStyle) write(h http.Header, d *Decision, policy []string, st *state, clock func() time.Time) {
	switch s {
	case HeadersIETF:
		buf := appendRateLimit(st.buf[:0], d)
		st.buf = buf
		if policy != nil {
			h[hPolicy] = policy
		}
		if len(buf) > 0 {
			h[hRateLimit] = st.lines.line(buf)
		}
	case HeadersRateLimit, HeadersXRateLimit:
		rr := mostConstrained(d)
		if rr == nil {
			return
		}
		names := &rateLimitNames
		if s == HeadersXRateLimit {
			names = &xRateLimitNames
		}
		h[names[0]] = st.lines.line(strconv.AppendInt(st.buf[:0], rr.Limit, 10))
		h[names[1]] = st.lines.line(strconv.AppendInt(st.buf[:0], rr.Remaining, 10))
		if s == HeadersXRateLimit {
			h[names[2]] = st.lines.line(strconv.AppendInt(st.buf[:0], epochCeil(clock().Add(rr.ResetAfter)), 10))
		} else {
			h[names[2]] = st.lines.line(appendSeconds(st.buf[:0], rr.ResetAfter))
		}
	}
}

// appendRateLimit appends the IETF RateLimit field's value for d to b:
// each advertised rule's state, only the rejecting rules' on a rejection.
func appendRateLimit(b []byte, d *Decision) []byte {
	for i := range d.Results {
		rr := &d.Results[i]
		if !rr.advertised() || !d.Allowed && rr.Allowed {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, rr.Rule.Name...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, rr.Remaining, 10)
		b = append(b, ";t="...)
		b = appendSeconds(b, rr.untilNext())
	}
	return b
}

// The single-policy styles' fields: limit, remaining, reset.
var (
	rateLimitNames  = [3]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset"}
	xRateLimitNames = [3]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}
)

// untilNext is the RateLimit field's t: the time until the rule takes one
// more unit, or for a rejecting rule its RetryAfter, so that Retry-After is
// the largest t of the rejecting rules.
func (rr *RuleResult) untilNext() time.Duration {
	if !rr.Allowed && rr.RetryAfter > 0 {
		return rr.RetryAfter
	}
	return rr.NextAfter
}

// advertised reports whether rr's state belongs in the headers: not a
// shadow or Hidden rule's, one that failed open, or a state never read.
func (rr *RuleResult) advertised() bool {
	return !rr.Rule.Shadow && !rr.Rule.Hidden && rr.Fallback != FailOpen && !rr.Unread
}

// mostConstrained is the rule a single-policy style reports: the first
// advertised rejecting rule, else the one with the fewest units left.
func mostConstrained(d *Decision) *RuleResult {
	if !d.Allowed {
		for i := range d.Results {
			if rr := &d.Results[i]; !rr.Allowed && rr.advertised() {
				return rr
			}
		}
		return nil
	}
	var best *RuleResult
	for i := range d.Results {
		rr := &d.Results[i]
		if !rr.advertised() {
			continue
		}
		if best == nil || rr.Remaining < best.Remaining {
			best = rr
		}
	}
	return best
}

// quotaText says a rule's limit for people: "3 per 900 s", or for a
// concurrency rule "3 at once".
func quotaText(r *Rule, limit int64) string {
	if r.Algorithm == Concurrency {
		return strconv.FormatInt(limit, 10) + " at once"
	}
	return strconv.FormatInt(limit, 10) + " per " + periodText(r.Period)
}

// periodText says a rule's period for people: "900 s", or Go's notation
// when it is not whole seconds ("1.5s").
func periodText(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + " s"
	}
	return d.String()
}

// seconds formats d as delta-seconds, rounded up so that a client that waits
// that long is admitted.
func seconds(d time.Duration) string {
	return string(appendSeconds(nil, d))
}

// epochCeil is t in Unix seconds, rounded up: a client that waits until
// then finds the rule reset.
func epochCeil(t time.Time) int64 {
	sec := t.Unix()
	if t.Nanosecond() > 0 {
		sec++
	}
	return sec
}

func appendSeconds(b []byte, d time.Duration) []byte {
	return strconv.AppendInt(b, ceilSeconds(d), 10)
}

// ceilSeconds is d in whole seconds, rounded up (0 for d <= 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// laterWait is the wait after which both a and b have passed:
// [backend.Never] when either is.
func laterWait(a, b time.Duration) time.Duration {
	if a == backend.Never || b == backend.Never {
		return backend.Never
	}
	return max(a, b)
}

// Problem is an RFC 9457 problem details body, as ceiling writes it for 429,
// 503, 400 and 413 responses.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// ViolatedPolicies names the rejecting rules, as the rate-limit draft's
	// quota-exceeded problem type defines it.
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// RetryAfter repeats the Retry-After header in seconds, for clients that
	// only read bodies.
	RetryAfter int64 `json:"retry-after,omitempty"`
}

// quotaExceededType is the problem type registered by the rate-limit headers
// draft for requests refused because a quota is exhausted.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// writeProblem writes p as application/problem+json with p.Status.
func writeProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; be safe anyway
		body = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// WriteRejection is the default [RejectHandler]: 429 with a quota-exceeded
// problem body naming every rejecting rule in declaration order
// ([RejectionProblem]).
func WriteRejection(w http.ResponseWriter, r *http.Request, d *Decision) {
	writeProblem(w, RejectionProblem(d))
}

// RejectionProblem is the problem body of a rejected decision: 429
// quota-exceeded, naming every rejecting rule with the limit that applied,
// and when to retry; a Hidden rule only when no other rule rejects too.
// Adapters for other protocols say the same from it.
func RejectionProblem(d *Decision) *Problem {
	p := &Problem{
		Type:   quotaExceededType,
		Title:  "Too Many Requests",
		Status: http.StatusTooManyRequests,
	}
	f := refusal(d)
	var quotas []string
	for i := range d.Results {
		if rr := &d.Results[i]; f.names(rr) {
			p.ViolatedPolicies = append(p.ViolatedPolicies, rr.Rule.Name)
			quotas = append(quotas, fmt.Sprintf("%s (%s)", rr.Rule.Name, quotaText(rr.Rule, rr.Limit)))
		}
	}
	p.Detail = "quota exceeded for " + strings.Join(quotas, ", ")
	if f.retryAfter == backend.Never {
		p.Detail += "; this request costs more than the quota can ever admit"
	} else if f.retryAfter > 0 {
		p.RetryAfter = ceilSeconds(f.retryAfter)
		p.Detail += fmt.Sprintf("; retry in %d s", p.RetryAfter)
	}
	return p
}

// shownRefusal is what a response may say about a rejected decision.
type shownRefusal struct {
	hideHidden bool          // a listed rule rejects: Hidden ones go unnamed
	retryAfter time.Duration // when every named rule admits, or backend.Never
}

// refusal is what a response may say about d: the rejecting rules (less the
// Hidden ones when a listed rule rejects too, so that a caller cannot watch
// a third party's key for free) and the wait after which all would admit.
func refusal(d *Decision) shownRefusal {
	var f shownRefusal
	for i := range d.Results {
		if rr := &d.Results[i]; !rr.Allowed && !rr.Rule.Shadow && !rr.Rule.Hidden {
			f.hideHidden = true
			break
		}
	}
	for i := range d.Results {
		rr := &d.Results[i]
		if !f.names(rr) {
			continue
		}
		f.retryAfter = laterWait(f.retryAfter, rr.RetryAfter)
	}
	return f
}

// names reports whether the response names rr as a rejecting rule.
func (f shownRefusal) names(rr *RuleResult) bool {
	return !rr.Allowed && !rr.Rule.Shadow && !(f.hideHidden && rr.Rule.Hidden)
}

// writeInputError answers a request a key function refused. An error whose
// text may name addresses, paths or Go types (see hides) gets a generic
// detail, its text going to the log only.
func (l *Limiter) writeInputError(w http.ResponseWriter, r *http.Request, e *inputError) {
	title, detail := "Bad Request", e.Error()
	switch e.status {
	case http.StatusRequestEntityTooLarge:
		title = "Content Too Large"
	case http.StatusRequestTimeout:
		title = "Request Timeout"
	}
	if hides(e.err) {
		var re *readError
		switch {
		case e.status == http.StatusRequestTimeout:
			detail = "the request body did not arrive in time"
		case errors.As(e.err, &re):
			detail = "the request body could not be read"
		default:
			detail = "the request is not valid input for this endpoint"
		}
		if e.rule != "" {
			detail = fmt.Sprintf("ceiling: rule %q: %s", e.rule, detail)
		}
		if re != nil || e.status == http.StatusRequestTimeout {
			// The body is half read: this connection cannot serve another request.
			w.Header()["Connection"] = []string{"close"}
		}
		l.cfg.logger.LogAttrs(r.Context(), slog.LevelInfo, "ceiling: refused a request whose input could not be read",
			slog.String("rule", e.rule), slog.Int("status", e.status), slog.String("remote_addr", r.RemoteAddr), slog.Any("err", e.err))
	}
	writeProblem(w, &Problem{Type: "about:blank", Title: title, Status: e.status, Detail: detail})
}

// hides reports whether err's text must not reach a client: a failure to
// read the body, or an error of the network, the file system or a Go
// decoder, whose texts hold addresses, paths and Go type names.
func hides(err error) bool {
	var (
		re  *readError
		ne  net.Error
		pe  *fs.PathError
		se  *os.SyscallError
		ute *json.UnmarshalTypeError
		iue *json.InvalidUnmarshalError
		num *strconv.NumError
	)
	return errors.As(err, &re) || errors.As(err, &ne) || errors.As(err, &pe) || errors.As(err, &se) ||
		errors.As(err, &ute) || errors.As(err, &iue) || errors.As(err, &num)
}

// writeUnavailable answers a request that cannot be decided while failing
// closed. The cause goes to logs and hooks, never to the client.
func writeUnavailable(w http.ResponseWriter, retry time.Duration) {
	w.Header()[hRetryAfter] = []string{seconds(retry)}
	writeProblem(w, &Problem{
		Type:       "about:blank",
		Title:      "Service Unavailable",
		Status:     http.StatusServiceUnavailable,
		Detail:     "the rate limiter cannot decide right now; retry later",
		RetryAfter: ceilSeconds(retry),
	})
}

// lineSlab hands out one-line header values carved from shared blocks that
// are never written again once carved, so a response owns its values (each
// slice has capacity 1) at one allocation per many responses.
type lineSlab struct {
	bytes []byte
	lines []string
}

const (
	slabBytes    = 2 << 10 // bytes of values per block
	slabLines    = 32      // values per block of slices
	slabMaxValue = 256     // longer values get allocations of their own
)

// line returns b as a one-line header value.
func (s *lineSlab) line(b []byte) []string {
	if len(b) == 0 || len(b) > slabMaxValue {
		return []string{string(b)}
	}
	if cap(s.bytes)-len(s.bytes) < len(b) {
		s.bytes = make([]byte, 0, slabBytes)
	}
	start := len(s.bytes)
	s.bytes = append(s.bytes, b...)
	if len(s.lines) == cap(s.lines) {
		s.lines = make([]string, 0, slabLines)
	}
	s.lines = append(s.lines, unsafe.String(&s.bytes[start], len(b)))
	n := len(s.lines)
	return s.lines[n-1 : n : n]
}
