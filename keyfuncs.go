package ceiling

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// A KeyFunc returns the value a rule limits by: a client address, an account,
// a phone number. ceiling never stores it raw (see [WithKeySecret]).
//
// An error wrapping [ErrNoKey] leaves the rule out for this request (an
// anonymous caller for a per-user rule). Any other error, or an empty value,
// is bad input: a 400 (413 for [ErrBodyTooLarge]) before any backend call,
// never one budget shared by every request without a key.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is returned by a [KeyFunc] when its rule does not apply to the
// request.
var ErrNoKey = errors.New("ceiling: no key")

// ErrBodyTooLarge is returned (wrapped) by key functions that read a request
// body larger than their bound; the middleware answers 413.
var ErrBodyTooLarge = errors.New("ceiling: request body too large")

// Must returns k, and panics if err is not nil, for key constructors called
// with literals: Must(ClientIP(TrustXForwardedFor("10.0.0.0/8"))) stops a
// mistake at start-up. Configuration read from a file should check err.
func Must(k KeyFunc, err error) KeyFunc {
	if err != nil {
		panic(err)
	}
	return k
}

// Static keys every request the same: one budget shared by all callers.
func Static(value string) KeyFunc {
	return func(*http.Request) (string, error) { return value, nil }
}

// Header keys by the value of a request header; a missing or empty header
// yields [ErrNoKey], and several lines with different values are a 400.
//
// A header is only as trustworthy as whoever wrote it: key on one your
// gateway sets, or whose value is checked later (an API key), never on one
// a client can vary for fresh budgets. Header on an address header any
// client can write (X-Forwarded-For, X-Real-IP...) warns once per process,
// and in every [Limiter.Health], naming the [ClientIP] option to use.
// Header panics if name is empty.
func Header(name string) KeyFunc {
	if name == "" {
		panic("ceiling: Header(\"\")")
	}
	name = http.CanonicalHeaderKey(name)
	if fix, ok := addressHeaders[name]; ok {
		spoofable.later(fmt.Sprintf("ceiling.Header(%q) keys on a value every client can write, so each spoofed value is a fresh budget; "+
			"key on the client address instead: ceiling.Must(ceiling.ClientIP(ceiling.%s))", name, fix))
	}
	what := "header " + name // built once: the key function does not allocate
	return func(r *http.Request) (string, error) {
		return single(r.Header[name], what)
	}
}

// addressHeaders are the headers that carry a client address, any client
// can write, and [ClientIP] reads safely: each with the option to use.
var addressHeaders = map[string]string{
	"X-Forwarded-For": "TrustXForwardedFor(your proxies' address ranges...)",
	"Forwarded":       "TrustForwarded(your proxies' address ranges...)",
	"X-Real-Ip":       `TrustHeader("X-Real-IP", your proxies' address ranges...)`,
	"True-Client-Ip":  `TrustHeader("True-Client-IP", your CDN's address ranges...)`,
}

// spoofable holds the warnings about [Header] keys on address headers,
// process-wide like the key functions: each logged once, by the first
// limiter's logger (flush), and kept for every limiter's health report.
var spoofable notes

// Query keys by the value of a URL query parameter; a missing or empty
// parameter yields [ErrNoKey], and repeated parameters with different values
// are a 400. Query panics if name is empty.
func Query(name string) KeyFunc {
	if name == "" {
		panic("ceiling: Query(\"\")")
	}
	what := "query parameter " + name
	return func(r *http.Request) (string, error) {
		if r.URL == nil || r.URL.RawQuery == "" {
			return "", ErrNoKey
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return "", fmt.Errorf("query: %w", err)
		}
		return single(q[name], what)
	}
}

// single returns the one value a repeated field holds: [ErrNoKey] when there
// is none (or it is empty), an error when copies disagree.
func single(vs []string, what string) (string, error) {
	if len(vs) == 0 {
		return "", ErrNoKey
	}
	for _, v := range vs[1:] {
		if v != vs[0] {
			return "", fmt.Errorf("%s given %d times with different values", what, len(vs))
		}
	}
	if vs[0] == "" {
		return "", ErrNoKey
	}
	return vs[0], nil
}

// Join keys by several values at once (the account and the route), each
// length-prefixed so that ("a|b", "c") and ("a", "b|c") differ. A part's
// [ErrNoKey] or error is Join's. Join panics without functions or with a
// nil one.
func Join(fns ...KeyFunc) KeyFunc {
	mustFuncs("Join", fns)
	return func(r *http.Request) (string, error) {
		var buf [64]byte
		b := buf[:0]
		for _, fn := range fns {
			v, err := fn(r)
			if err != nil {
				return "", err
			}
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			b = append(b, v...)
		}
		return string(b), nil
	}
}

// FirstOf keys by the first function that has a key for the request (a
// verified account, else the client address); [ErrNoKey] passes to the
// next, any other error is returned. The key is tagged with the function's
// position, so a user named "192.0.2.1" and that address do not share a
// budget. FirstOf panics without functions or with a nil one.
func FirstOf(fns ...KeyFunc) KeyFunc {
	mustFuncs("FirstOf", fns)
	return func(r *http.Request) (string, error) {
		for i, fn := range fns {
			v, err := fn(r)
			if err == nil {
				return strconv.Itoa(i) + ":" + v, nil
			}
			if !errors.Is(err, ErrNoKey) {
				return "", err
			}
		}
		return "", ErrNoKey
	}
}

// Skip leaves a rule out for the requests pred selects (health checks) and
// keys the others with fn. Select on what a client cannot forge. Skip
// panics if either argument is nil.
func Skip(pred func(*http.Request) bool, fn KeyFunc) KeyFunc {
	if pred == nil || fn == nil {
		panic("ceiling: Skip with a nil predicate or key function")
	}
	return func(r *http.Request) (string, error) {
		if pred(r) {
			return "", ErrNoKey
		}
		return fn(r)
	}
}

// Normalize passes the key fn returns through norm, so that spellings of one
// value share a budget (see [Digits] and [Lower]). An error from norm is bad
// input (a 400) unless it wraps [ErrNoKey]; an empty result is [ErrNoKey].
// Normalize panics if either argument is nil.
func Normalize(fn KeyFunc, norm func(string) (string, error)) KeyFunc {
	if fn == nil || norm == nil {
		panic("ceiling: Normalize with a nil key function or normaliser")
	}
	return func(r *http.Request) (string, error) {
		v, err := fn(r)
		if err != nil {
			return "", err
		}
		if v, err = norm(v); err != nil {
			return "", err
		}
		if v == "" {
			return "", ErrNoKey
		}
		return v, nil
	}
}

// Digits normalises a phone number to its digits: "+254 700 000 000" and
// "254700000000" are one key. Anything but ASCII digits, spaces and "+-.()"
// is an error, so that look-alike characters cannot make a second key for
// one number. It knows no numbering plan: parse real numbers into E.164
// with a phone-number library, as examples/otp does.
func Digits(s string) (string, error) {
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			n++
		case c == ' ' || c == '+' || c == '-' || c == '.' || c == '(' || c == ')':
		default:
			return "", errors.New("not a phone number: only digits, spaces and +-.() allowed")
		}
	}
	if n == 0 {
		return "", errors.New("not a phone number: no digits")
	}
	if n == len(s) {
		return s, nil
	}
	b := make([]byte, 0, n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= '0' && c <= '9' {
			b = append(b, c)
		}
	}
	return string(b), nil
}

// Lower trims surrounding space and lower-cases (Unicode), so that
// "Alice@Example.com " and "alice@example.com" are one key. It does not
// undo sub-addressing ("alice+1@example.com" stays another mailbox).
func Lower(s string) (string, error) {
	return strings.ToLower(strings.TrimSpace(s)), nil
}

func mustFuncs(name string, fns []KeyFunc) {
	if len(fns) == 0 {
		panic("ceiling: " + name + "() needs at least one key function")
	}
	for i, fn := range fns {
		if fn == nil {
			panic(fmt.Sprintf("ceiling: %s: key function %d is nil", name, i))
		}
	}
}
