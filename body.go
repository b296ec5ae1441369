package ceiling

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBodyTimeout is returned (wrapped) by key functions whose request body
// did not arrive in time; the middleware answers 408.
var ErrBodyTimeout = errors.New("ceiling: request body not received in time")

// BodyField returns a [KeyFunc] that keys by a field of a JSON request body:
// "phone", or "user.id" for {"user": {"id": ...}}, so that an OTP endpoint
// can limit by the phone number the client names in the body.
//
// The body is read once per request however many rules use it, bounded in
// size ([BodyLimit]; past it a 413) and time ([BodyTimeout]; a 408), and the
// handler then reads exactly the bytes the client sent. It is JSON whatever
// its Content-Type. Malformed JSON is a 400, and so is a field that appears
// twice on the path in any letter case, since parsers disagree on which
// copy wins. A missing field, null or "" yields [ErrNoKey]; a string or
// boolean is the key; an object or array is a 400. A number is keyed by its
// integer value (1e3 and 1000.0 are "1000"); a fraction or a number of more
// than 20 digits is a 400.
//
// BodyField returns an error for an empty path or segment. The KeyFunc is
// safe for simultaneous use.
func BodyField(path string, opts ...BodyOption) (KeyFunc, error) {
	segs := strings.Split(path, ".")
	if slices.Contains(segs, "") {
		return nil, fmt.Errorf("ceiling: BodyField(%q): empty name in path", path)
	}
	return bodyKeyFunc("BodyField", path, opts, func(_ *http.Request, cb *cachedBody) (string, error) {
		root, err := cb.jsonTree()
		if err != nil {
			return "", err
		}
		return root.lookup(path, segs)
	})
}

// FormField returns a [KeyFunc] that keys by a form field as
// [http.Request.FormValue] sees it: a URL-encoded or multipart body (files
// ignored) and the query. The body is read as by [BodyField]. A missing or
// empty field yields [ErrNoKey]; copies with different values or a
// malformed body are a 400. It returns an error for an empty name.
func FormField(name string, opts ...BodyOption) (KeyFunc, error) {
	if name == "" {
		return nil, errors.New("ceiling: FormField: empty name")
	}
	return bodyKeyFunc("FormField", name, opts, func(r *http.Request, cb *cachedBody) (string, error) {
		form, err := cb.formValues(r)
		if err != nil {
			return "", err
		}
		vs := form[name]
		if r.URL != nil && r.URL.RawQuery != "" {
			q, err := url.ParseQuery(r.URL.RawQuery)
			if err != nil {
				return "", fmt.Errorf("query: %w", err)
			}
			vs = append(vs[:len(vs):len(vs)], q[name]...)
		}
		return single(vs, "form field "+name)
	})
}

// A BodyOption configures [BodyField] and [FormField].
type BodyOption func(*bodyKey) error

// BodyLimit sets how many bytes of the body may be read (default 64 KiB).
// Rules with different limits on one body each apply their own.
func BodyLimit(n int64) BodyOption {
	return func(b *bodyKey) error {
		if n <= 0 {
			return fmt.Errorf("BodyLimit(%d): must be positive", n)
		}
		b.limit = n
		return nil
	}
}

// BodyTimeout sets how long the body may take to arrive from the first
// read (default 5 seconds); past it the request is answered 408.
func BodyTimeout(d time.Duration) BodyOption {
	return func(b *bodyKey) error {
		if d <= 0 {
			return fmt.Errorf("BodyTimeout(%v): must be positive", d)
		}
		b.timeout = d
		return nil
	}
}

type bodyKey struct {
	limit   int64
	timeout time.Duration
}

// bodyKeyFunc applies opts and returns the KeyFunc that reads the body and
// hands it to key.
func bodyKeyFunc(fn, arg string, opts []BodyOption, key func(*http.Request, *cachedBody) (string, error)) (KeyFunc, error) {
	b := bodyKey{limit: 64 << 10, timeout: 5 * time.Second}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("ceiling: %s(%q): nil option", fn, arg)
		}
		if err := o(&b); err != nil {
			return nil, fmt.Errorf("ceiling: %s(%q): %w", fn, arg, err)
		}
	}
	return func(r *http.Request) (string, error) {
		cb, err := bodyOf(r, b)
		if err != nil {
			return "", err
		}
		return key(r, cb)
	}, nil
}

// cachedBody replaces r.Body once a key function has read it: the handler
// reads the same bytes, followed by whatever was not read.
type cachedBody struct {
	buf  []byte
	off  int           // the handler's read position in buf
	rest io.ReadCloser // the original body
	done bool          // rest is exhausted: buf is the whole body
	err  error         // the error that stopped reading, if not EOF

	parsedJSON bool
	tree       *jvalue
	jsonErr    error

	parsedForm bool
	form       url.Values
	formErr    error
}

func (c *cachedBody) Read(p []byte) (int, error) {
	if c.off < len(c.buf) {
		n := copy(p, c.buf[c.off:])
		c.off += n
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	return c.rest.Read(p)
}

func (c *cachedBody) Close() error { return c.rest.Close() }

// bodyOf returns r's body read up to b.limit bytes, reading (more of) it
// only the first time a rule needs it, within b.timeout when the middleware
// guards the body.
func bodyOf(r *http.Request, b bodyKey) (*cachedBody, error) {
	limit := b.limit
	cb, ok := r.Body.(*cachedBody)
	if !ok {
		if r.ContentLength > limit {
			return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, r.ContentLength, limit)
		}
		rest := r.Body
		if rest == nil {
			rest = http.NoBody
		}
		cb = &cachedBody{rest: rest}
		r.Body = cb
	}
	if !cb.done && cb.err == nil && int64(len(cb.buf)) <= limit {
		want := limit + 1 - int64(len(cb.buf))
		if g, ok := cb.rest.(*bodyGuard); ok {
			g.arm(r, b.timeout)
		}
		more, err := io.ReadAll(io.LimitReader(cb.rest, want))
		cb.buf = append(cb.buf, more...)
		switch {
		case err != nil:
			cb.err = err
		case int64(len(more)) < want:
			cb.done = true
		}
	}
	if int64(len(cb.buf)) > limit {
		return nil, fmt.Errorf("%w: limit %d bytes", ErrBodyTooLarge, limit)
	}
	if cb.err != nil {
		return nil, &readError{err: cb.err}
	}
	return cb, nil
}

// readError is a failure to read the request body: the client's doing (it
// was too slow, or hung up) or the network's, never the input's content.
// Its text is for logs; clients get a generic detail.
type readError struct{ err error }

func (e *readError) Error() string { return "reading the request body: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// Is makes a read that ran out of time match [ErrBodyTimeout].
func (e *readError) Is(target error) bool {
	if target != ErrBodyTimeout {
		return false
	}
	var ne net.Error
	return errors.Is(e.err, os.ErrDeadlineExceeded) || errors.As(e.err, &ne) && ne.Timeout()
}

// bodyGuard stands in for r.Body while the middleware resolves keys, so
// that a body key function, which has the request but not the
// ResponseWriter, can bound its read with the connection's read deadline.
type bodyGuard struct {
	io.ReadCloser
	w http.ResponseWriter
}

// arm sets the connection's read deadline d from now, unless the server's
// ReadTimeout is no longer. Nothing lifts it: net/http clears it once the
// body is read, and a deadline set after that would cancel the handler.
func (g *bodyGuard) arm(r *http.Request, d time.Duration) {
	if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok && srv.ReadTimeout > 0 && srv.ReadTimeout <= d {
		return
	}
	_ = http.NewResponseController(g.w).SetReadDeadline(time.Now().Add(d))
}

// decideGuarded is decide with r.Body guarded (see bodyGuard) while the key
// functions run. The guard lives in st and is gone before decide returns,
// so that nothing the handler holds points into the pooled state.
func (l *Limiter) decideGuarded(w http.ResponseWriter, r *http.Request, st *state) error {
	if r.Body == nil || r.Body == http.NoBody {
		return l.decide(r, st)
	}
	st.guard = bodyGuard{ReadCloser: r.Body, w: w}
	r.Body = &st.guard
	err := l.decide(r, st)
	if cb, ok := r.Body.(*cachedBody); ok && cb.rest == &st.guard {
		cb.rest = st.guard.ReadCloser
	} else if r.Body == &st.guard {
		r.Body = st.guard.ReadCloser
	}
	st.guard = bodyGuard{}
	return err
}

// inputStatus is the status of a request whose key function failed with
// err (not ErrNoKey): 413 for a body over its limit, 408 for one that did
// not arrive in time, else 400.
func inputStatus(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, ErrBodyTooLarge) || errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrBodyTimeout):
		return http.StatusRequestTimeout
	}
	return http.StatusBadRequest
}

// maxJSONDepth matches encoding/json's nesting limit, so that the limiter
// refuses no body the handler could decode, and deep nesting cannot exhaust
// the stack.
const maxJSONDepth = 10000

// jvalue is a parsed JSON value that keeps object members in order, with
// duplicates, so that ambiguous bodies can be told apart.
type jvalue struct {
	kind    byte // 's'tring, 'n'umber, 'b'oolean, 'z' null, 'o'bject, 'a'rray
	text    string
	names   []string
	members []*jvalue
}

func (c *cachedBody) jsonTree() (*jvalue, error) {
	if !c.parsedJSON {
		c.parsedJSON = true
		c.tree, c.jsonErr = parseJSON(c.buf)
	}
	return c.tree, c.jsonErr
}

// parseJSON parses one JSON value; an empty body is nil.
func parseJSON(b []byte) (*jvalue, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("body is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("body is not valid JSON: data after the value")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (*jvalue, error) {
	if depth > maxJSONDepth {
		return nil, errors.New("nested too deeply")
	}
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		v := &jvalue{kind: 'a'}
		if t == '{' {
			v.kind = 'o'
		}
		for dec.More() {
			if v.kind == 'o' {
				nt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				name, _ := nt.(string)
				v.names = append(v.names, name)
			}
			m, err := parseValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			if v.kind == 'o' {
				v.members = append(v.members, m)
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return v, nil
	case string:
		return &jvalue{kind: 's', text: t}, nil
	case json.Number:
		return &jvalue{kind: 'n', text: string(t)}, nil
	case bool:
		if t {
			return &jvalue{kind: 'b', text: "true"}, nil
		}
		return &jvalue{kind: 'b', text: "false"}, nil
	default:
		return &jvalue{kind: 'z'}, nil
	}
}

// lookup follows the path from v, refusing names that appear twice in any
// letter case.
func (v *jvalue) lookup(path string, segs []string) (string, error) {
	for _, seg := range segs {
		if v == nil || v.kind != 'o' {
			return "", ErrNoKey
		}
		var next *jvalue
		for i, name := range v.names {
			if !strings.EqualFold(name, seg) {
				continue
			}
			if next != nil {
				return "", fmt.Errorf("body field %q appears more than once", path)
			}
			next = v.members[i]
		}
		v = next
	}
	switch {
	case v == nil || v.kind == 'z' || v.kind == 's' && v.text == "":
		return "", ErrNoKey
	case v.kind == 'o' || v.kind == 'a':
		return "", fmt.Errorf("body field %q is not a string, number or boolean", path)
	case v.kind == 'n':
		k, err := canonicalInteger(v.text)
		if err != nil {
			return "", fmt.Errorf("body field %q: %w", path, err)
		}
		return k, nil
	}
	return v.text, nil
}

// maxKeyDigits is the most digits a numeric key may have: enough for every
// int64 and uint64.
const maxKeyDigits = 20

// canonicalInteger returns the plain decimal form of a JSON number with an
// integer value ("1e3", "1000.0" and "10E2" are "1000"), or an error for a
// fraction or a number of more than maxKeyDigits digits. It works on the
// digits, never in floating point, and never expands an exponent beyond
// maxKeyDigits, so "1e999999999" costs nothing. s must be valid JSON number
// syntax.
func canonicalInteger(s string) (string, error) {
	if len(s) <= maxKeyDigits && s != "-0" && !strings.ContainsAny(s, ".eE") {
		return s, nil // JSON allows no leading zeros: already canonical
	}
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mant, exp := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0", nil
	}
	// The value is digits × 10^scale.
	trimmed := strings.TrimRight(digits, "0")
	scale := int64(len(digits)-len(trimmed)) - int64(len(frac))
	digits = trimmed
	if exp != "" {
		e := strings.TrimLeft(strings.TrimPrefix(strings.TrimPrefix(exp, "+"), "-"), "0")
		if len(e) > 6 { // far beyond any key; also keeps the sum below from overflowing
			if strings.HasPrefix(exp, "-") {
				return "", errors.New("a number with a fraction cannot be a key")
			}
			return "", fmt.Errorf("a number of more than %d digits cannot be a key", maxKeyDigits)
		}
		n, _ := strconv.ParseInt("0"+e, 10, 64)
		if strings.HasPrefix(exp, "-") {
			n = -n
		}
		scale += n
	}
	switch {
	case scale < 0:
		return "", errors.New("a number with a fraction cannot be a key")
	case int64(len(digits))+scale > maxKeyDigits:
		return "", fmt.Errorf("a number of more than %d digits cannot be a key", maxKeyDigits)
	}
	var b strings.Builder
	b.Grow(1 + len(digits) + int(scale))
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(digits)
	for range scale {
		b.WriteByte('0')
	}
	return b.String(), nil
}

func (c *cachedBody) formValues(r *http.Request) (url.Values, error) {
	if !c.parsedForm {
		c.parsedForm = true
		c.form, c.formErr = parseForm(r.Header.Get("Content-Type"), c.buf)
	}
	return c.form, c.formErr
}

func parseForm(contentType string, b []byte) (url.Values, error) {
	mt, params, _ := mime.ParseMediaType(contentType)
	if mt != "multipart/form-data" {
		vs, err := url.ParseQuery(string(b))
		if err != nil {
			return nil, fmt.Errorf("form body: %w", err)
		}
		return vs, nil
	}
	boundary := params["boundary"]
	if boundary == "" {
		return nil, errors.New("multipart form without a boundary")
	}
	vs := url.Values{}
	mr := multipart.NewReader(bytes.NewReader(b), boundary)
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return vs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("multipart form: %w", err)
		}
		name := p.FormName()
		if name == "" || p.FileName() != "" {
			continue
		}
		v, err := io.ReadAll(p)
		if err != nil {
			return nil, fmt.Errorf("multipart form: %w", err)
		}
		vs[name] = append(vs[name], string(v))
	}
}
