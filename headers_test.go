package ceiling

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// unitRules are one rule of each kind a policy item can describe: a count
// of requests (no qu), a token budget (qu="tokens"), a concurrency rule
// (qu="concurrent-requests", no w), a per-request limit (the policy is
// built per request), and shadow and hidden rules, which are never
// advertised.
func unitRules() []Rule {
	return []Rule{
		{Name: "chat:minute", Key: Static("s"), Limit: 3, Period: time.Minute, Algorithm: SlidingLog},
		{Name: "chat:tokens", Key: Static("s"), Limit: 100, Period: 24 * time.Hour, Algorithm: FixedWindow, Cost: 40, Unit: "tokens"},
		{Name: "chat:inflight", Key: Static("s"), Limit: 2, Period: time.Minute, Algorithm: Concurrency},
		{Name: "chat:plan", Key: Static("s"), Limit: 5, Period: time.Hour, Unit: "content-bytes",
			Limits: func(*http.Request) (int64, int64, error) { return 7, 0, nil }},
		{Name: "chat:new", Key: Static("s"), Limit: 1, Period: time.Hour, Shadow: true},
		{Name: "chat:dest", Key: Static("d"), Limit: 9, Period: time.Hour, Hidden: true},
	}
}

// Every rate-limit field ceiling sends is a valid Structured Field list
// (RFC 8941) of the shape the draft gives it, on admissions and on the 429
// that follows, and RateLimit-Policy says each rule's unit: qu is a String
// for a rule that does not count requests and absent for one that does.
// Retry-After is delta-seconds (RFC 9110).
func TestHeaderValuesAreStructuredFields(t *testing.T) {
	l := MustNew(unitRules(), WithShadowHeader(), WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	wantUnit := map[string]string{"chat:minute": "", "chat:tokens": "tokens", "chat:inflight": "concurrent-requests", "chat:plan": "content-bytes"}
	var codes []int
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		codes = append(codes, w.Code)
		hd := w.Header()

		policy := sfField(t, hd, "RateLimit-Policy")
		seen := map[string]bool{}
		for _, m := range policy {
			name, ok := m.value.(string)
			if !ok {
				t.Fatalf("RateLimit-Policy member %+v is not a String", m)
			}
			seen[name] = true
			want, known := wantUnit[name]
			if !known {
				t.Errorf("RateLimit-Policy advertises %q", name)
				continue
			}
			if q, ok := m.param("q"); !ok || !isNonNegInt(q) {
				t.Errorf("%s: q = %v, want a non-negative Integer", name, q)
			}
			qu, hasQU := m.param("qu")
			if s, isString := qu.(string); want == "" && hasQU || want != "" && (!isString || s != want) {
				t.Errorf("%s: qu = %#v (present %v), want %q", name, qu, hasQU, want)
			}
			w, hasW := m.param("w")
			if concurrency := name == "chat:inflight"; concurrency == hasW || hasW && !isNonNegInt(w) {
				t.Errorf("%s: w = %#v (present %v)", name, w, hasW)
			}
		}
		if len(seen) != len(wantUnit) {
			t.Errorf("RateLimit-Policy %q names %v, want every advertised rule", hd.Get("RateLimit-Policy"), seen)
		}
		for _, m := range sfField(t, hd, "RateLimit") {
			r, rok := m.param("r")
			tt, tok := m.param("t")
			if _, ok := m.value.(string); !ok || !rok || !tok || !isNonNegInt(r) || !isNonNegInt(tt) {
				t.Errorf("RateLimit member %+v: want a String with non-negative Integer r and t", m)
			}
		}
		for _, m := range sfField(t, hd, "RateLimit-Shadow") {
			if _, ok := m.value.(string); !ok || len(m.params) > 0 {
				t.Errorf("RateLimit-Shadow member %+v: want a bare String", m)
			}
		}
		if ra := hd.Get("Retry-After"); ra != "" {
			if n, err := strconv.ParseUint(ra, 10, 63); err != nil || strconv.FormatUint(n, 10) != ra {
				t.Errorf("Retry-After %q is not delta-seconds", ra)
			}
		}
	}
	// The token rule's cost of 40 in 100 rejects the third request.
	if got, want := codes, []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("codes %v, want %v", got, want)
	}
}

// The policy field reads q in the rule's unit: the token budget's item is
// exactly its quota, unit and window.
func TestPolicyNamesTheUnit(t *testing.T) {
	l := MustNew([]Rule{
		{Name: "chat:tokens", Key: Static("s"), Limit: 200000, Period: 24 * time.Hour, Algorithm: FixedWindow, Unit: "tokens"},
		{Name: "chat:minute", Key: Static("s"), Limit: 30, Period: time.Minute},
	}, WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { l.Close() })
	w := httptest.NewRecorder()
	l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if got, want := w.Header().Get("RateLimit-Policy"), `"chat:tokens";q=200000;qu="tokens";w=86400, "chat:minute";q=30;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
}

// A unit that a Structured Field string could not carry unescaped, or that
// is not a unit name, is refused when the limiter is built.
func TestRuleUnitIsValidated(t *testing.T) {
	for _, u := range []string{"Tokens", `to"ks`, `a\b`, "-x", "1k", "content bytes", "tökens"} {
		_, err := New([]Rule{{Name: "r", Key: Static("s"), Limit: 1, Period: time.Minute, Unit: u}})
		if err == nil || !strings.Contains(err.Error(), `rule "r": unit`) {
			t.Errorf("Unit %q: err = %v, want the rule's unit refused", u, err)
		}
	}
	for _, u := range []string{"", "tokens", "content-bytes", "requests", "kb2"} {
		if _, err := New([]Rule{{Name: "r", Key: Static("s"), Limit: 1, Period: time.Minute, Unit: u}}); err != nil {
			t.Errorf("Unit %q: %v", u, err)
		}
	}
}

// sfField parses header name as a Structured Field list; absent is empty.
func sfField(t *testing.T, h http.Header, name string) []sfItem {
	t.Helper()
	v := h.Get(name)
	if v == "" {
		return nil
	}
	list, err := parseSFList(v)
	if err != nil {
		t.Fatalf("%s %q: %v", name, v, err)
	}
	return list
}

func isNonNegInt(v any) bool {
	n, ok := v.(int64)
	return ok && n >= 0
}

// An RFC 8941 (HTTP Structured Field Values) list parser, enough of the
// specification to check what ceiling sends instead of matching strings:
// members that are items or inner lists, parameters, and every bare item
// type (integer, decimal, string, token, byte sequence, boolean). It
// follows the parsing algorithms of RFC 8941 section 4.2 and fails where
// they fail.

// sfToken is a Token bare item, distinct from a String.
type sfToken string

// sfParam is one parameter, in order.
type sfParam struct {
	key   string
	value any
}

// sfItem is a list member: a bare item (int64, float64, string, sfToken,
// []byte, bool) or, when inner is non-nil, an inner list; with its
// parameters.
type sfItem struct {
	value  any
	inner  []sfItem
	params []sfParam
}

// param returns the value of the parameter named key, and whether it is
// present.
func (it sfItem) param(key string) (any, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.value, true
		}
	}
	return nil, false
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool  { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }
func (p *sfParser) errf(format string, args ...any) error {
	return fmt.Errorf("sf: at %d of %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

// parseSFList parses a field value as a List (RFC 8941 4.2.1).
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	for !p.eof() && p.peek() == ' ' {
		p.i++
	}
	var list []sfItem
	for !p.eof() {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		list = append(list, m)
		p.ows()
		if p.eof() {
			return list, nil
		}
		if p.peek() != ',' {
			return nil, p.errf("want ',' between members")
		}
		p.i++
		p.ows()
		if p.eof() {
			return nil, p.errf("trailing comma")
		}
	}
	return list, nil
}

func (p *sfParser) ows() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *sfParser) member() (sfItem, error) {
	if !p.eof() && p.peek() == '(' {
		return p.innerList()
	}
	return p.item()
}

func (p *sfParser) innerList() (sfItem, error) {
	p.i++ // (
	it := sfItem{inner: []sfItem{}}
	for !p.eof() {
		for !p.eof() && p.peek() == ' ' {
			p.i++
		}
		if p.eof() {
			break
		}
		if p.peek() == ')' {
			p.i++
			params, err := p.params()
			it.params = params
			return it, err
		}
		m, err := p.item()
		if err != nil {
			return it, err
		}
		it.inner = append(it.inner, m)
		if p.eof() || (p.peek() != ' ' && p.peek() != ')') {
			return it, p.errf("want SP or ')' in an inner list")
		}
	}
	return it, p.errf("unterminated inner list")
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.params()
	return sfItem{value: v, params: params}, err
}

func (p *sfParser) params() ([]sfParam, error) {
	var params []sfParam
	for !p.eof() && p.peek() == ';' {
		p.i++
		for !p.eof() && p.peek() == ' ' {
			p.i++
		}
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var value any = true
		if !p.eof() && p.peek() == '=' {
			p.i++
			if value, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range params {
			if params[j].key == key {
				params[j].value, replaced = value, true
			}
		}
		if !replaced {
			params = append(params, sfParam{key, value})
		}
	}
	return params, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.eof() || !(isLCAlpha(p.peek()) || p.peek() == '*') {
		return "", p.errf("a key starts with a lowercase letter or '*'")
	}
	for !p.eof() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.eof() {
		return nil, p.errf("want an item")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	}
	return nil, p.errf("no item starts with %q", p.peek())
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if p.eof() || !isDigit(p.peek()) {
		return nil, p.errf("want a digit")
	}
	decimal := false
	for !p.eof() {
		c := p.peek()
		if c == '.' && !decimal {
			if p.i-start > 12 {
				return nil, p.errf("a decimal has at most 12 integer digits")
			}
			decimal = true
		} else if !isDigit(c) {
			break
		}
		p.i++
		if !decimal && p.i-start > 15 || decimal && p.i-start > 16 {
			return nil, p.errf("number too long")
		}
	}
	num := p.s[start:p.i]
	if !decimal {
		return strconv.ParseInt(num, 10, 64)
	}
	if strings.HasSuffix(num, ".") || len(num)-strings.IndexByte(num, '.')-1 > 3 {
		return nil, p.errf("a decimal has 1 to 3 fractional digits")
	}
	return strconv.ParseFloat(num, 64)
}

func (p *sfParser) str() (any, error) {
	p.i++ // "
	var b strings.Builder
	for !p.eof() {
		c := p.peek()
		p.i++
		switch {
		case c == '\\':
			if p.eof() || (p.peek() != '"' && p.peek() != '\\') {
				return nil, p.errf("bad escape")
			}
			b.WriteByte(p.peek())
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.errf("byte %#x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.errf("unterminated string")
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for !p.eof() && (isTChar(p.peek()) || p.peek() == ':' || p.peek() == '/') {
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func (p *sfParser) bytes() (any, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, p.errf("unterminated byte sequence")
	}
	b, err := base64.StdEncoding.DecodeString(p.s[p.i : p.i+end])
	p.i += end + 1
	return b, err
}

func (p *sfParser) boolean() (any, error) {
	p.i++ // ?
	if p.eof() || (p.peek() != '0' && p.peek() != '1') {
		return nil, p.errf("want ?0 or ?1")
	}
	v := p.peek() == '1'
	p.i++
	return v, nil
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// The parser itself, on the specification's own examples and on inputs it
// must refuse, so that a test passing through it proves something.
func TestSFListParser(t *testing.T) {
	l, err := parseSFList(`"a";r=1;t=0, tok;q=?1, (1 2.5 :aGk=:);w=-3, "q\"s"`)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 4 || l[0].value != "a" || l[1].value != sfToken("tok") || l[3].value != `q"s` {
		t.Fatalf("parsed %+v", l)
	}
	if r, _ := l[0].param("r"); r != int64(1) {
		t.Errorf("r = %#v", r)
	}
	if q, _ := l[1].param("q"); q != true {
		t.Errorf("q = %#v", q)
	}
	if in := l[2].inner; len(in) != 3 || in[0].value != int64(1) || in[1].value != 2.5 || string(in[2].value.([]byte)) != "hi" {
		t.Errorf("inner list %+v", in)
	}
	for _, bad := range []string{`"a",`, `"a" "b"`, `"a";R=1`, `"a`, `1.2345`, `"a";r=1.`, `(1 2`, `"\q"`, `?2`, "\"a\x01\""} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("%q parsed without error", bad)
		}
	}
}

// answer is what one response says about the rules.
type answer struct {
	status     int
	ratelimit  string
	policy     string
	retryAfter int
	violated   []string
}

func answerOf(t *testing.T, w *httptest.ResponseRecorder) answer {
	t.Helper()
	a := answer{status: w.Code, ratelimit: w.Header().Get("RateLimit"), policy: w.Header().Get("RateLimit-Policy")}
	a.retryAfter, _ = strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code == http.StatusTooManyRequests {
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("429 body %s: %v", w.Body, err)
		}
		a.violated = p.ViolatedPolicies
		if strings.Contains(w.Body.String(), "otp:phone") && !slices.Contains(p.ViolatedPolicies, "otp:phone") {
			t.Errorf("the problem body names otp:phone without its refusal: %s", w.Body)
		}
	}
	return a
}

// rules names the rules a RateLimit field lists.
func (a answer) rules() []string {
	var names []string
	for _, m := range strings.Split(a.ratelimit, ", ") {
		if name, _, ok := strings.Cut(m, ";"); ok {
			names = append(names, strings.Trim(name, `"`))
		}
	}
	return names
}

// TestA429IsNotAnOracle pins issue 14's first finding, on memory and on a
// real Redis (whose deny cache answers the repeated rejections): a caller
// who has spent their own address budget asks for codes to a victim's
// phone, before and after the victim received codes from elsewhere, and
// learns nothing about the phone; the phone rule, Hidden, is in no header,
// and a 429 names only the rules that refused it.
func TestA429IsNotAnOracle(t *testing.T) {
	for _, be := range []struct {
		name string
		new  func(t *testing.T) backend.Backend
	}{
		{"memory", func(*testing.T) backend.Backend { return nil }},
		{"redis", func(t *testing.T) backend.Backend {
			return ceilingredis.New(redistest.Shared(t).Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)))
		}},
	} {
		for _, hidden := range []bool{true, false} {
			t.Run(be.name+"/hidden="+strconv.FormatBool(hidden), func(t *testing.T) {
				oracleScenario(t, be.new(t), hidden)
			})
		}
	}
}

// oracleScenario is TestA429IsNotAnOracle on one backend (nil: memory).
// Without Hidden the phone's state shows on the caller's own admitted
// requests and on a refusal by the phone alone, but never on a 429 the
// address rule decided.
func oracleScenario(t *testing.T, b backend.Backend, hidden bool) {
	var opts []Option
	if b != nil {
		opts = append(opts, WithBackend(b), WithTimeout(5*time.Second))
	}
	l := MustNew([]Rule{
		{Name: "otp:phone", Key: Header("X-Phone"), Limit: 3, Period: time.Hour, Algorithm: SlidingLog, Hidden: hidden},
		{Name: "otp:ip", Key: RemoteAddr, Limit: 2, Period: 15 * time.Minute, Algorithm: SlidingLog},
	}, opts...)
	defer l.Close()
	h := l.Handler(okHandler)
	ask := func(peer, phone string) answer {
		r := httptest.NewRequest("POST", "/otp", nil)
		r.RemoteAddr, r.Header["X-Phone"] = peer+":1", []string{phone}
		return answerOf(t, serve(t, h, r))
	}
	const attacker, victim = "203.0.113.66", "+447700900777"

	for _, p := range []string{"+447700900001", "+447700900002"} {
		if a := ask(attacker, p); a.status != 200 || hidden == slices.Contains(a.rules(), "otp:phone") || hidden == strings.Contains(a.policy, "otp:phone") {
			t.Fatalf("admitted: %+v; want 200, otp:phone in the headers only when not hidden", a)
		}
	}
	before := ask(attacker, victim)
	// The victim gets codes from elsewhere, up to the phone's limit.
	for i := range 3 {
		if a := ask("198.51.100."+strconv.Itoa(i), victim); a.status != 200 || hidden == slices.Contains(a.rules(), "otp:phone") {
			t.Fatalf("the victim's own request: %+v", a)
		}
	}
	// The phone alone refuses: the refusal names it (that cannot be
	// hidden), and only a listed rule shows its state.
	if a := ask("198.51.100.9", victim); a.status != 429 || !slices.Equal(a.violated, []string{"otp:phone"}) || hidden != (a.ratelimit == "") || a.retryAfter < 3000 {
		t.Errorf("the phone at its limit: %+v; want 429 naming otp:phone, a RateLimit field only when not hidden, Retry-After about an hour", a)
	}
	after, again := ask(attacker, victim), ask(attacker, victim)
	// Before the victim's codes only the address rule refuses: the phone's
	// state is not shown, hidden or not.
	if !slices.Equal(before.rules(), []string{"otp:ip"}) || !slices.Equal(before.violated, []string{"otp:ip"}) || before.retryAfter > 900 {
		t.Errorf("the attacker's first 429: %+v; want only otp:ip, Retry-After within its 15 minutes", before)
	}
	for _, a := range []answer{after, again} {
		if !hidden {
			// Both rules refuse now, and both are listed: what Hidden is for.
			if !slices.Equal(a.violated, []string{"otp:phone", "otp:ip"}) {
				t.Errorf("without Hidden, the 429 names %v, want both rules", a.violated)
			}
			continue
		}
		if a.status != 429 || !slices.Equal(a.rules(), before.rules()) || !slices.Equal(a.violated, before.violated) || a.retryAfter > 900 {
			t.Errorf("the attacker's 429 after the victim's codes: %+v; want what it was before: %+v", a, before)
		}
	}
}

// Hidden rules are in no header style, and a shadow Hidden rule in no
// RateLimit-Shadow field: the single-policy styles report the listed rule
// even when a hidden one has less left, and nothing when only hidden rules
// refuse (Retry-After still says when to come back).
func TestHiddenRuleInNoHeaderStyle(t *testing.T) {
	for _, style := range []HeaderStyle{HeadersIETF, HeadersRateLimit, HeadersXRateLimit} {
		l := MustNew([]Rule{
			{Name: "third", Key: Static("x"), Limit: 1, Period: time.Minute, Hidden: true},
			{Name: "probe", Key: Static("x"), Limit: 1, Period: time.Minute, Hidden: true, Shadow: true},
			{Name: "own", Key: Static("y"), Limit: 50, Period: time.Minute},
		}, WithHeaders(style), WithShadowHeader())
		h := l.Handler(okHandler)
		admitted, refused := serve(t, h, httptest.NewRequest("GET", "/", nil)), serve(t, h, httptest.NewRequest("GET", "/", nil))
		for i, w := range []*httptest.ResponseRecorder{admitted, refused} {
			for name, vs := range w.Header() {
				if v := strings.Join(vs, ","); strings.Contains(v, "third") || strings.Contains(v, "probe") {
					t.Errorf("style %d, request %d: %s: %q names a hidden rule", style, i, name, v)
				}
			}
		}
		if style != HeadersIETF {
			prefix := map[HeaderStyle]string{HeadersRateLimit: "RateLimit-", HeadersXRateLimit: "X-RateLimit-"}[style]
			if got := admitted.Header().Get(prefix + "Limit"); got != "50" {
				t.Errorf("style %d: %sLimit %q, want 50 (the listed rule, not the hidden one with less left)", style, prefix, got)
			}
			if got := refused.Header().Get(prefix + "Limit"); got != "" {
				t.Errorf("style %d: refused by the hidden rule alone: %sLimit %q, want none", style, prefix, got)
			}
		}
		if refused.Code != 429 || refused.Header().Get("Retry-After") == "" {
			t.Errorf("style %d: %d (Retry-After %q), want a 429 with Retry-After", style, refused.Code, refused.Header().Get("Retry-After"))
		}
		l.Close()
	}
}

// rateLimitField parses the RateLimit field as a Structured Field list and
// returns each policy's r and t by name; the test fails on a field that is
// not a valid list of strings with integer r and t.
func rateLimitField(t *testing.T, h http.Header) map[string][2]int64 {
	t.Helper()
	list, err := parseSFList(h.Get("RateLimit"))
	if err != nil {
		t.Fatalf("RateLimit %q: %v", h.Get("RateLimit"), err)
	}
	out := map[string][2]int64{}
	for _, m := range list {
		name, ok := m.value.(string)
		r, rok := m.param("r")
		tt, tok := m.param("t")
		ri, rint := r.(int64)
		ti, tint := tt.(int64)
		if !ok || !rok || !tok || !rint || !tint || ri < 0 || ti < 0 {
			t.Fatalf("RateLimit member %+v: want a string with non-negative integer r and t", m)
		}
		out[name] = [2]int64{ri, ti}
	}
	return out
}

// TestRateLimitTIsDraft11 pins issue 19's table for every algorithm: limit
// 2 per 8 s, one unit at 0 s, one at 2 s, a third at 2 s. t is the seconds
// until one more unit is available (draft-11), not until the quota is whole
// again (draft-08), and the 429's Retry-After equals the rejecting rule's t.
func TestRateLimitTIsDraft11(t *testing.T) {
	for _, alg := range backend.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			store, clock := fakeMemory(t)
			checkDraft11(t, alg, clock, WithBackend(store))
		})
	}
}

// draft11T is issue 19's table: t after the second unit, in seconds,
// rounded up; the third request's Retry-After is the same. The working,
// per ALGORITHMS.md, is in the comments.
var draft11T = map[backend.Algorithm]int64{
	// T = 4 s, tau = 8 s: tat 8 s at 2 s, one more at tat + T - tau.
	GCRA: 2,
	// the unit of 0 s leaves at 8 s.
	SlidingLog: 6,
	// W = 0.5 s: bucket 0 counts until 17W = 8.5 s.
	RollingWindow: 7,
	// the window [0, 8 s) ends.
	FixedWindow: 6,
	// cur = 2 becomes prev = 2 at 8 s and must weigh at most 0.5:
	// remm <= 4000 ms, at 9.999001 s.
	SlidingWindow: 10,
}

// checkDraft11 runs issue 19's sequence through a limiter of one rule of
// alg (limit 2 per 8 s) built with opts, whose backend reads clock:
// requests at 0 s and 2 s are admitted with t = 0 then the table's t, and
// a third at 2 s is a 429 whose Retry-After is that t and whose RateLimit
// says the same. It returns the handler, for more requests at later
// instants (see draft11Get).
func checkDraft11(t *testing.T, alg backend.Algorithm, clock *backendtest.Clock, opts ...Option) http.Handler {
	t.Helper()
	want, ok := draft11T[alg]
	if !ok {
		t.Fatalf("no expectation for %v", alg)
	}
	l := MustNew([]Rule{{Name: "r", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: alg}}, opts...)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(okHandler)
	w := draft11Get(t, h, clock, 0)
	if got := rateLimitField(t, w.Header())["r"]; w.Code != 200 || got != [2]int64{1, 0} {
		t.Errorf("first: %d r,t = %v, want 200 and 1,0 (a unit is available now)", w.Code, got)
	}
	w = draft11Get(t, h, clock, 2*time.Second)
	if got := rateLimitField(t, w.Header())["r"]; w.Code != 200 || got != [2]int64{0, want} {
		t.Errorf("second: %d r,t = %v, want 200 and 0,%d", w.Code, got, want)
	}
	checkDraft11Refusal(t, "third", draft11Get(t, h, clock, 2*time.Second), want)
	return h
}

// draft11Get sends one request to h at Epoch+at on clock.
func draft11Get(t *testing.T, h http.Handler, clock *backendtest.Clock, at time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	clock.Set(backendtest.Epoch.Add(at))
	return serve(t, h, httptest.NewRequest("GET", "/", nil))
}

// checkDraft11Refusal checks that w is a 429 with Retry-After want and
// rule r's RateLimit member at r=0, t=Retry-After.
func checkDraft11Refusal(t *testing.T, which string, w *httptest.ResponseRecorder, want int64) {
	t.Helper()
	retry, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if w.Code != http.StatusTooManyRequests || err != nil || retry != want {
		t.Errorf("%s: %d Retry-After %q, want 429 and %d", which, w.Code, w.Header().Get("Retry-After"), want)
	}
	if got := rateLimitField(t, w.Header())["r"]; got != [2]int64{0, retry} {
		t.Errorf("%s: r,t = %v, want 0,%d: t equals Retry-After", which, got, retry)
	}
}

// With several rules on a 429, each rejecting rule's t is its own wait and
// Retry-After is the largest of them; a rule with room is not listed (a
// 429 shows only the rules that refused it, issue 14), and a request too
// costly for the rest of a rule's budget (but not for one unit) still gets
// t equal to Retry-After.
func TestRateLimitTOnA429WithSeveralRules(t *testing.T) {
	store, clock := fakeMemory(t)
	l := MustNew([]Rule{
		{Name: "log", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: SlidingLog},
		{Name: "gcra", Key: Static("k"), Limit: 2, Period: 8 * time.Second, Algorithm: GCRA},
		{Name: "roomy", Key: Static("k"), Limit: 100, Period: 8 * time.Second},
	}, WithBackend(store))
	h := l.Handler(okHandler)
	for _, at := range []time.Duration{0, 2 * time.Second, 2 * time.Second} {
		clock.Set(backendtest.Epoch.Add(at))
		w := serve(t, h, httptest.NewRequest("GET", "/", nil))
		if w.Code != http.StatusTooManyRequests {
			continue
		}
		got := rateLimitField(t, w.Header())
		if _, listed := got["roomy"]; got["log"] != [2]int64{0, 6} || got["gcra"] != [2]int64{0, 2} || listed {
			t.Errorf("RateLimit %v, want log 0,6 gcra 0,2 and no roomy", got)
		}
		if ra := w.Header().Get("Retry-After"); ra != "6" {
			t.Errorf("Retry-After %q, want 6, the largest t of the rejecting rules", ra)
		}
		return
	}
	t.Fatal("the third request was not refused")
}

// A request of cost 2 with 1 unit left is refused although one unit is
// available: the rejecting rule's t is the request's wait (Retry-After),
// never earlier, as the draft requires.
func TestRateLimitTOfACostlyRejection(t *testing.T) {
	store, clock := fakeMemory(t)
	l := MustNew([]Rule{{Name: "r", Key: Static("k"), Limit: 3, Period: 8 * time.Second, Algorithm: SlidingLog, Cost: 2}}, WithBackend(store))
	h := l.Handler(okHandler)
	if w := serve(t, h, httptest.NewRequest("GET", "/", nil)); w.Code != 200 {
		t.Fatalf("first: %d", w.Code)
	}
	clock.Set(backendtest.Epoch.Add(3 * time.Second))
	w := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("second: %d Retry-After %q, want 429 and 5", w.Code, w.Header().Get("Retry-After"))
	}
	if got := rateLimitField(t, w.Header())["r"]; got != [2]int64{1, 5} {
		t.Errorf("r,t = %v, want 1,5", got)
	}
}

// The RateLimit values of many responses share blocks of memory: each must
// stay what it was when its response was written, whatever the requests
// after it do, and a handler that appends to its header must not reach
// another response's value.
func TestRateLimitValuesOutliveLaterResponses(t *testing.T) {
	l := MustNew([]Rule{{Name: "ip", Key: RemoteAddr, Limit: 1000, Period: time.Hour}})
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	type kept struct {
		held []string // the header map's slice, as the response keeps it
		was  string   // a copy of its value when the response was written
	}
	var all []kept
	for i := range 300 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "203.0.113.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		v := w.Header()["Ratelimit"]
		if len(v) != 1 || !strings.HasPrefix(v[0], `"ip";r=`) {
			t.Fatalf("request %d: RateLimit %q", i, v)
		}
		all = append(all, kept{v, strings.Clone(v[0])})
	}
	for _, k := range all {
		_ = append(k.held, "appended by a handler") // capacity 1: a copy, never the next value
	}
	for i, k := range all {
		if len(k.held) != 1 || k.held[0] != k.was {
			t.Fatalf("response %d: RateLimit became %q, was %q", i, k.held, k.was)
		}
	}
	if all[0].was == all[len(all)-1].was {
		t.Fatalf("every response says %q: the test did not see the budget change", all[0].was)
	}
}
