package ceiling

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

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
