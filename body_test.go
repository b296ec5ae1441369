package ceiling

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/big"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// countingBody is a request body that counts the bytes read from it and how
// often it was read past its end.
type countingBody struct {
	r      io.Reader
	n      int
	eofs   int
	closed bool
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	if err == io.EOF {
		c.eofs++
	}
	return n, err
}

func (c *countingBody) Close() error { c.closed = true; return nil }

func bodyRequest(contentType, body string) *http.Request {
	r := httptest.NewRequest("POST", "/otp", strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r
}

func TestBodyFieldJSON(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		want       string
		err        error
	}{
		{"phone", `{"phone": "+254700000000"}`, "+254700000000", nil},
		{"user.id", `{"user": {"id": 42, "name": "x"}, "id": 7}`, "42", nil},
		{"user.id", `{"user": {"id": 4.2e1}}`, "42", nil},
		{"ok", `{"ok": true}`, "true", nil},
		{"phone", `{"PHONE": "+1"}`, "+1", nil}, // encoding/json would fill a Phone field from it
		{"phone", `{"to": "+1"}`, "", ErrNoKey},
		{"phone", `{"phone": null}`, "", ErrNoKey},
		{"phone", `{"phone": ""}`, "", ErrNoKey},
		{"phone", ``, "", ErrNoKey},
		{"phone", "  \n", "", ErrNoKey},
		{"phone", `["phone"]`, "", ErrNoKey},
		{"user.id", `{"user": "bob"}`, "", ErrNoKey},
		{"phone", `{"phone": "+1", "phone": "+2"}`, "", errBad},
		{"phone", `{"phone": "+1", "Phone": "+2"}`, "", errBad},
		{"user.id", `{"user": {"id": 1}, "User": {"x": 1}}`, "", errBad},
		{"phone", `{"phone": {"n": "+1"}}`, "", errBad},
		{"phone", `{"phone": ["+1"]}`, "", errBad},
		{"phone", `{"phone": "+1"`, "", errBad},
		{"phone", `{"phone": "+1"} {"phone": "+2"}`, "", errBad},
		{"phone", `{"phone": +1}`, "", errBad},
		{"phone", `{phone: "+1"}`, "", errBad},
	} {
		got, err := Must(BodyField(tc.path))(bodyRequest("application/json", tc.body))
		checkKey(t, tc.path+" in "+tc.body, got, err, tc.want, tc.err)
	}
}

// TestBodyFieldNumbersAreKeyedByValue pins issue 14's fifth finding: the
// spellings of one integer are one key, and numbers that are not integers
// of at most 20 digits are refused, never keyed by their spelling.
func TestBodyFieldNumbersAreKeyedByValue(t *testing.T) {
	for _, tc := range []struct {
		num, want string // want "" for a 400
	}{
		{"1000", "1000"}, {"1000.0", "1000"}, {"1e3", "1000"}, {"10E2", "1000"}, {"1E+3", "1000"},
		{"10000e-1", "1000"}, {"0.1e4", "1000"}, {"1000.000e0", "1000"},
		{"15550001111.0", "15550001111"}, {"1.5550001111e10", "15550001111"},
		{"0", "0"}, {"-0", "0"}, {"0.0", "0"}, {"-0.0e5", "0"}, {"0e999999999999", "0"},
		{"-42", "-42"}, {"-4.2e1", "-42"},
		{"18446744073709551615", "18446744073709551615"}, // the largest uint64: 20 digits
		{"-9223372036854775808", "-9223372036854775808"},
		{"1.8446744073709551615e19", "18446744073709551615"},
		{"1.5", ""}, {"1e-1", ""}, {"1000.5", ""}, {"15550001111.01", ""},
		{"100000000000000000000", ""}, {"1e20", ""}, {"1e999999999", ""}, {"1e-999999999", ""},
		{"1e99999999999999999999999", ""}, {"1" + strings.Repeat("0", 29) + "e-10", "1" + strings.Repeat("0", 19)},
	} {
		body := `{"n": ` + tc.num + `}`
		got, err := Must(BodyField("n"))(bodyRequest("application/json", body))
		if tc.want == "" {
			checkKey(t, body, got, err, "", errBad)
			continue
		}
		checkKey(t, body, got, err, tc.want, nil)
	}
	// A number and the string of its digits name one value.
	if got := mustKey(t, Must(BodyField("n")), bodyRequest("", `{"n": "1000"}`)); got != "1000" {
		t.Errorf(`"1000" as a string: key %q`, got)
	}
}

// Through the middleware: the spellings of 1000 share one budget,
// and a fraction is a 400 that spends nothing.
func TestNumericBodyKeysShareOneBudget(t *testing.T) {
	be := &quota{}
	h := MustNew([]Rule{{Name: "item", Key: Must(BodyField("id")), Limit: 3, Period: time.Hour}}, WithBackend(be)).Handler(okHandler)
	var got []int
	for _, n := range []string{"1000", "1000.0", "1e3", "10E2", "1000.5"} {
		got = append(got, serve(t, h, bodyRequest("application/json", `{"id": `+n+`}`)).Code)
	}
	if want := []int{200, 200, 200, 429, 400}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	phone := MustNew([]Rule{{Name: "phone", Key: Must(BodyField("phone")), Limit: 1, Period: time.Hour}}, WithBackend(&quota{})).Handler(okHandler)
	got = got[:0]
	for _, n := range []string{"15550001111.0", "15550001111", "155500011110"} {
		got = append(got, serve(t, phone, bodyRequest("application/json", `{"phone": `+n+`}`)).Code)
	}
	if want := []int{200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("15550001111.0, 15550001111, 155500011110: statuses %v, want %v", got, want)
	}
}

func TestBodyFieldIgnoresContentType(t *testing.T) {
	// A handler decoding JSON does not look at Content-Type; neither may the
	// limiter, or a text/plain request would skip the phone rule.
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		if got := mustKey(t, Must(BodyField("phone")), bodyRequest(ct, `{"phone":"+1"}`)); got != "+1" {
			t.Errorf("Content-Type %q: key %q", ct, got)
		}
	}
}

// Two rules read one body: it is read from the client once, parsed once,
// and the handler reads exactly the bytes that were sent.
func TestBodyIsReadOnceAndLeftIntact(t *testing.T) {
	body := `{"phone": "+254 700 000 000", "user": {"id": "u1"}, "message": "` + strings.Repeat("x", 5000) + `"}`
	src := &countingBody{r: strings.NewReader(body)}
	r := httptest.NewRequest("POST", "/otp", nil)
	r.Body = src
	var seen []byte
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = io.ReadAll(r.Body)
		r.Body.Close()
	})
	be := &quota{}
	h := MustNew([]Rule{
		{Name: "phone", Key: Normalize(Must(BodyField("phone")), Digits), Limit: 3, Period: time.Minute},
		{Name: "user", Key: Must(BodyField("user.id")), Limit: 3, Period: time.Minute},
		{Name: "ip", Key: RemoteAddr, Limit: 3, Period: time.Minute},
	}, WithBackend(be)).Handler(handler)
	if got := statuses(t, h, r); got[0] != 200 {
		t.Fatalf("status %d", got[0])
	}
	if string(seen) != body {
		t.Errorf("handler read %d bytes, not the %d sent", len(seen), len(body))
	}
	if src.n != len(body) || src.eofs != 1 || !src.closed {
		t.Errorf("client body: %d bytes read, %d reads at EOF, closed %v; want %d, 1, true", src.n, src.eofs, src.closed, len(body))
	}
	if got, want := be.calls, 1; got != want {
		t.Errorf("backend calls %d", got)
	}
}

func TestBodyIsParsedOnce(t *testing.T) {
	r := bodyRequest("application/json", `{"a": "1", "b": "2"}`)
	mustKey(t, Must(BodyField("a")), r)
	cb := r.Body.(*cachedBody)
	tree := cb.tree
	if got := mustKey(t, Must(BodyField("b")), r); got != "2" || cb.tree != tree || r.Body != io.ReadCloser(cb) {
		t.Errorf("second rule re-read or re-parsed the body (key %q)", got)
	}
	form := bodyRequest("application/x-www-form-urlencoded", "a=1&b=2")
	mustKey(t, Must(FormField("a")), form)
	fcb := form.Body.(*cachedBody)
	values := fcb.form
	if mustKey(t, Must(FormField("b")), form); form.Body.(*cachedBody) != fcb || len(fcb.form) != len(values) {
		t.Error("second form rule re-parsed")
	}
}

// Requests whose rules never ask for the body keep their body untouched.
func TestBodyUntouchedWhenNoRuleNeedsIt(t *testing.T) {
	src := &countingBody{r: strings.NewReader(`{"phone":"+1"}`)}
	r := httptest.NewRequest("POST", "/", nil)
	r.Body = src
	var body io.ReadCloser
	h := MustNew([]Rule{
		{Name: "ip", Key: RemoteAddr, Limit: 3, Period: time.Minute},
		{Name: "phone", Key: Skip(func(*http.Request) bool { return true }, Must(BodyField("phone"))), Limit: 3, Period: time.Minute},
	}, WithBackend(&quota{})).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { body = r.Body }))
	statuses(t, h, r)
	if body != io.ReadCloser(src) || src.n != 0 {
		t.Errorf("body replaced or read (%d bytes) although no rule needed it", src.n)
	}
}

func TestBodyLimits(t *testing.T) {
	big := `{"phone": "+1", "pad": "` + strings.Repeat("x", 100) + `"}`
	small, large := Must(BodyField("phone", BodyLimit(50))), Must(BodyField("phone", BodyLimit(1000)))

	// The small rule first: 413 for it, but the large rule reads on, and the
	// handler still gets every byte.
	r := httptest.NewRequest("POST", "/", nil)
	r.Body = io.NopCloser(strings.NewReader(big)) // no Content-Length
	r.ContentLength = -1
	if _, err := small(r); !errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("over the limit: err = %v, want ErrBodyTooLarge", err)
	}
	if got := mustKey(t, large, r); got != "+1" {
		t.Errorf("larger limit: key %q", got)
	}
	if all, _ := io.ReadAll(r.Body); string(all) != big {
		t.Errorf("handler read %q", all)
	}

	// A declared Content-Length over the limit is refused without reading.
	src := &countingBody{r: strings.NewReader(big)}
	r = httptest.NewRequest("POST", "/", nil)
	r.Body, r.ContentLength = src, int64(len(big))
	if _, err := small(r); !errors.Is(err, ErrBodyTooLarge) || src.n != 0 {
		t.Errorf("declared length: err = %v after reading %d bytes", err, src.n)
	}

	// An http.MaxBytesReader installed earlier keeps its say.
	r = httptest.NewRequest("POST", "/", nil)
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(big)), 20)
	r.ContentLength = -1
	var mbe *http.MaxBytesError
	if _, err := large(r); !errors.As(err, &mbe) {
		t.Errorf("MaxBytesReader: err = %v", err)
	}

	if _, err := BodyField("phone", BodyLimit(0)); err == nil || !strings.Contains(err.Error(), `ceiling: BodyField("phone"): BodyLimit(0)`) {
		t.Errorf("BodyLimit(0): err = %v", err)
	}
	for _, p := range []string{"", ".", "user.", "a..b"} {
		if _, err := BodyField(p); err == nil {
			t.Errorf("BodyField(%q) accepted", p)
		}
	}
}

// Bad bodies are answered before any backend call: 400 for malformed or
// ambiguous JSON, 413 for a body over the limit, both problem+json.
func TestBadBodiesAreProblemsBeforeTheBackend(t *testing.T) {
	be := &scripted{}
	h := MustNew([]Rule{
		{Name: "otp:ip", Key: RemoteAddr, Limit: 10, Period: time.Minute},
		{Name: "otp:to", Key: Must(BodyField("to", BodyLimit(64))), Limit: 3, Period: time.Minute},
	}, WithBackend(be)).Handler(okHandler)
	for _, tc := range []struct {
		body   string
		status int
	}{
		{`{"to": "+1"`, 400},
		{`{"to": "+1", "TO": "+2"}`, 400},
		{`{"to": "+1", "pad": "` + strings.Repeat("x", 64) + `"}`, 413},
	} {
		w := serve(t, h, bodyRequest("application/json", tc.body))
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != tc.status || p.Status != tc.status ||
			w.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, `"otp:to"`) {
			t.Errorf("%.30s: %d %s", tc.body, w.Code, w.Body)
		}
	}
	if n := be.callCount(); n != 0 {
		t.Errorf("backend called %d times", n)
	}
	if got := serve(t, h, bodyRequest("application/json", `{"to": "+1"}`)).Code; got != 200 || be.callCount() != 1 {
		t.Errorf("good body: %d, %d calls", got, be.callCount())
	}
}

func TestFormField(t *testing.T) {
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	mw.WriteField("phone", "+254700000000")
	fw, _ := mw.CreateFormFile("phone", "evil.txt")
	fw.Write([]byte("+1 999"))
	mw.Close()

	for _, tc := range []struct {
		name, ct, target, body string
		want                   string
		err                    error
	}{
		{"urlencoded", "application/x-www-form-urlencoded", "/otp", "phone=%2B254700000000&x=1", "+254700000000", nil},
		{"any content type", "text/plain", "/otp", "phone=1", "1", nil},
		{"multipart, files ignored", mw.FormDataContentType(), "/otp", mp.String(), "+254700000000", nil},
		{"query, as FormValue falls back to it", "application/x-www-form-urlencoded", "/otp?phone=2", "", "2", nil},
		{"same in query and body", "application/x-www-form-urlencoded", "/otp?phone=2", "phone=2", "2", nil},
		{"empty in the body, a value in the query", "application/x-www-form-urlencoded", "/otp?phone=3", "phone=", "", errBad},
		{"query and body disagree", "application/x-www-form-urlencoded", "/otp?phone=3", "phone=2", "", errBad},
		{"repeated in the body", "application/x-www-form-urlencoded", "/otp", "phone=1&phone=2", "", errBad},
		{"missing", "application/x-www-form-urlencoded", "/otp", "to=1", "", ErrNoKey},
		{"empty", "application/x-www-form-urlencoded", "/otp", "phone=", "", ErrNoKey},
		{"malformed", "application/x-www-form-urlencoded", "/otp", "phone=%zz", "", errBad},
		{"multipart without boundary", "multipart/form-data", "/otp", "phone=1", "", errBad},
		{"broken multipart", mw.FormDataContentType(), "/otp", "--nope", "", errBad},
	} {
		r := httptest.NewRequest("POST", tc.target, strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.ct)
		got, err := Must(FormField("phone"))(r)
		checkKey(t, tc.name, got, err, tc.want, tc.err)
		if rest, _ := io.ReadAll(r.Body); string(rest) != tc.body {
			t.Errorf("%s: handler reads %q, want %q", tc.name, rest, tc.body)
		}
	}
}

// BenchmarkBodyField measures reading and parsing a small JSON body for one
// rule, and for two rules reading different fields of it (the second costs
// a lookup, not a parse).
func BenchmarkBodyField(b *testing.B) {
	body := `{"phone": "+254700000000", "user": {"id": "u1"}, "message": "hello"}`
	phone, user := Must(BodyField("phone")), Must(BodyField("user.id"))
	for _, bc := range []struct {
		name string
		fns  []KeyFunc
	}{{"rules=1", []KeyFunc{phone}}, {"rules=2", []KeyFunc{phone, user}}} {
		b.Run(bc.name, func(b *testing.B) {
			r := httptest.NewRequest("POST", "/", nil)
			src := strings.NewReader(body)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(body)
				r.Body = io.NopCloser(src)
				for _, fn := range bc.fns {
					if _, err := fn(r); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// rawPost opens a TCP connection to srv, sends a POST declaring a body of
// declared bytes, then the bytes of body one every interval (all at once
// for 0), half-closing afterwards when hangUp is set, and returns the
// response the server sends whenever it sends it.
func rawPost(t *testing.T, srv *httptest.Server, declared int, body string, every time.Duration, hangUp bool) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second)) // a hung server fails the test, not the run
	fmt.Fprintf(conn, "POST /otp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if every == 0 {
			io.WriteString(conn, body)
		} else {
			for i := range len(body) {
				if _, err := conn.Write([]byte{body[i]}); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(every):
				}
			}
		}
		if hangUp {
			conn.(*net.TCPConn).CloseWrite()
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// bodyServer serves a limiter keyed on the body's phone, logging to logs.
func bodyServer(t *testing.T, logs *bytes.Buffer, next http.Handler, opts ...BodyOption) *httptest.Server {
	t.Helper()
	l := MustNew([]Rule{{Name: "otp:phone", Key: Must(BodyField("phone", opts...)), Limit: 100, Period: time.Minute}},
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	srv := httptest.NewServer(l.Handler(next)) // no ReadTimeout: the key function must bound itself
	t.Cleanup(func() {
		srv.Close()
		l.Close()
	})
	return srv
}

// checkGeneric fails the test if a client-facing body holds anything of the
// server's network error.
func checkGeneric(t *testing.T, srv *httptest.Server, body string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	for _, leak := range []string{"127.0.0.1", port, "tcp", "i/o", "EOF", "read ", "*", "net."} {
		if strings.Contains(body, leak) {
			t.Errorf("the response body holds %q: %s", leak, body)
		}
	}
}

// TestSlowBodyIs408 pins issue 14's second finding with a real slow client:
// one byte a second, on a server without ReadTimeout. BodyField's own bound
// answers 408 with a generic detail; the network error goes to the log.
func TestSlowBodyIs408(t *testing.T) {
	var logs bytes.Buffer
	srv := bodyServer(t, &logs, okHandler, BodyTimeout(300*time.Millisecond))
	body := `{"phone": "+254700000000"}`
	resp, got := rawPost(t, srv, len(body), body, time.Second, false)
	if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" || !resp.Close {
		t.Errorf("%d %q (close %v), want 408 problem+json, Connection: close", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Close)
	}
	var p Problem
	if err := json.Unmarshal([]byte(got), &p); err != nil || p.Status != 408 || p.Detail != `ceiling: rule "otp:phone": the request body did not arrive in time` {
		t.Errorf("problem %s (%v)", got, err)
	}
	checkGeneric(t, srv, got)
	if !strings.Contains(logs.String(), "i/o timeout") || !strings.Contains(logs.String(), "status=408") {
		t.Errorf("the log lacks the full error:\n%s", logs.String())
	}
}

// A client that hangs up half way is a 400, as generic.
func TestBodyReadErrorIsAGeneric400(t *testing.T) {
	var logs bytes.Buffer
	srv := bodyServer(t, &logs, okHandler)
	resp, got := rawPost(t, srv, 100, `{"phone": "+2547`, 0, true)
	var p Problem
	if err := json.Unmarshal([]byte(got), &p); err != nil || resp.StatusCode != 400 || p.Detail != `ceiling: rule "otp:phone": the request body could not be read` {
		t.Errorf("%d %s (%v), want 400 with a generic detail", resp.StatusCode, got, err)
	}
	checkGeneric(t, srv, got)
	if !strings.Contains(logs.String(), "unexpected EOF") {
		t.Errorf("the log lacks the full error:\n%s", logs.String())
	}
}

// Once the body is read to its end, no deadline is left on the connection:
// a handler that works longer than the body's bound (and the server's
// ReadTimeout) keeps its request context. A deadline set after net/http
// started its background read would end that read, which cancels it.
func TestBodyDeadlineIsGoneForTheHandler(t *testing.T) {
	const bound = 200 * time.Millisecond
	cancelled := make(chan bool, 1)
	l := MustNew([]Rule{{Name: "otp:phone", Key: Must(BodyField("phone", BodyTimeout(bound))), Limit: 100, Period: time.Minute}})
	defer l.Close()
	srv := httptest.NewUnstartedServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			cancelled <- true
		case <-time.After(4 * bound):
			cancelled <- false
		}
	})))
	srv.Config.ReadTimeout = 2 * bound
	srv.Start()
	defer srv.Close()
	body := `{"phone": "+254700000000"}`
	resp, _ := rawPost(t, srv, len(body), body, 0, false)
	if resp.StatusCode != 200 || <-cancelled {
		t.Errorf("status %d; the handler's context was cancelled: a read deadline outlived the body", resp.StatusCode)
	}
}

// The server's own ReadTimeout, when sooner, still ends a slow body.
func TestServerReadTimeoutStillBoundsTheBody(t *testing.T) {
	var logs bytes.Buffer
	l := MustNew([]Rule{{Name: "otp:phone", Key: Must(BodyField("phone")), Limit: 100, Period: time.Minute}},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer l.Close()
	srv := httptest.NewUnstartedServer(l.Handler(okHandler))
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	defer srv.Close()
	body := `{"phone": "+254700000000"}`
	if resp, got := rawPost(t, srv, len(body), body, time.Second, false); resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("%d %s, want 408 after the server's 300ms ReadTimeout (BodyField's 5s bound would come later)", resp.StatusCode, got)
	}
}

// A key function's error reaches the client only when it describes the
// input: errors of the file system, the network or a Go decoder, which name
// paths, addresses and Go types, become a generic detail, logged in full.
func TestInputErrorsKeepInternalsOut(t *testing.T) {
	var jsonErr error
	var into struct{ N int }
	if jsonErr = json.Unmarshal([]byte(`{"N": "x"}`), &into); jsonErr == nil {
		t.Fatal("no json error")
	}
	_, numErr := strconv.Atoi("12x")
	for _, tc := range []struct {
		name   string
		err    error
		detail string
		leak   string
	}{
		{"path", fmt.Errorf("loading the allow list: %w", &fs.PathError{Op: "open", Path: "/srv/app/allow.txt", Err: fs.ErrNotExist}), "the request is not valid input for this endpoint", "/srv/app"},
		{"network", &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5432}, Err: errors.New("refused")}, "the request is not valid input for this endpoint", "10.1.2.3"},
		{"Go type", jsonErr, "the request is not valid input for this endpoint", "Go struct"},
		{"strconv", numErr, "the request is not valid input for this endpoint", "strconv."},
		{"about the input", errors.New("the phone number has letters"), "the phone number has letters", "\x00"},
	} {
		var logs bytes.Buffer
		err := tc.err
		h := MustNew([]Rule{{Name: "r", Key: func(*http.Request) (string, error) { return "", err }, Limit: 1, Period: time.Minute}},
			WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))).Handler(okHandler)
		w := serve(t, h, httptest.NewRequest("GET", "/", nil))
		var p Problem
		if jerr := json.Unmarshal(w.Body.Bytes(), &p); jerr != nil || w.Code != 400 || p.Detail != `ceiling: rule "r": `+tc.detail || strings.Contains(w.Body.String(), tc.leak) {
			t.Errorf("%s: %d %s, want 400 with detail %q", tc.name, w.Code, w.Body, tc.detail)
		}
		if logged := logs.String(); tc.detail != "the phone number has letters" && !strings.Contains(logged, tc.leak) {
			t.Errorf("%s: the log lacks the full error:\n%s", tc.name, logged)
		}
	}
}

// FuzzBodyField checks the body-field key against encoding/json, which most
// handlers use: whenever the limiter finds a key, the handler decoding the
// same bytes into a struct finds the same value; whenever the limiter finds
// none, neither does the handler; and the handler always reads the bytes
// that were sent.
func FuzzBodyField(f *testing.F) {
	for _, s := range []string{
		`{"phone": "+254700000000"}`, `{"Phone": 254700000000}`, `{"phone": "a", "PHONE": "b"}`,
		`{"phone": null}`, `{"phone": {"x": 1}}`, `{"user": {"id": "u1"}}`, `[1, 2]`, `"str"`, ``,
		`{"phone": "\u0041\ud800"}`, `{"phone": true} x`, `{"pho\u006ee": "1"}`,
		// Numeric spellings of one value, fractions, huge exponents.
		`{"phone": 1000}`, `{"phone": 1000.0}`, `{"phone": 1e3}`, `{"phone": 10E2}`, `{"phone": 15550001111.0}`,
		`{"phone": -0.0}`, `{"phone": 1.5}`, `{"phone": 1e999999999}`, `{"phone": 18446744073709551615}`,
	} {
		f.Add(s)
	}
	phone, form := Must(BodyField("phone")), Must(FormField("phone"))
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		got, err := phone(r)
		if rest, _ := io.ReadAll(r.Body); string(rest) != body {
			t.Fatalf("handler reads %q, sent %q", rest, body)
		}
		if errors.Is(err, ErrBodyTooLarge) {
			return
		}
		var handler struct {
			Phone any `json:"phone"`
		}
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		herr := dec.Decode(&handler)
		if herr == nil && dec.More() {
			herr = errors.New("trailing data")
		}
		hv := ""
		switch v := handler.Phone.(type) {
		case string:
			hv = v
		case json.Number:
			// Keyed by value: the integer's plain digits, or refused.
			hv = integerOracle(t, v.String())
		case bool:
			hv = "false"
			if v {
				hv = "true"
			}
		}
		switch {
		case hv == oracleSkip:
			if err == nil && len(got) > 21 {
				t.Fatalf("body %q: limiter keys a %d-byte number", body, len(got))
			}
		case err == nil:
			if herr != nil || hv != got {
				t.Fatalf("body %q: limiter keys %q, handler decodes %q (%v)", body, got, hv, herr)
			}
		case errors.Is(err, ErrNoKey):
			if len(bytes.TrimSpace([]byte(body))) > 0 && herr == nil && hv != "" {
				t.Fatalf("body %q: limiter has no key, handler decodes %q", body, hv)
			}
		}

		fr := httptest.NewRequest("POST", "/", strings.NewReader(body))
		fr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		fk, ferr := form(fr)
		if rest, _ := io.ReadAll(fr.Body); string(rest) != body {
			t.Fatalf("form: handler reads %q, sent %q", rest, body)
		}
		if ferr == nil {
			fr2 := httptest.NewRequest("POST", "/", strings.NewReader(body))
			fr2.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if v := fr2.FormValue("phone"); v != fk {
				t.Fatalf("form %q: limiter keys %q, FormValue %q", body, fk, v)
			}
		}
	})
}

// integerOracle is the key an independent reading gives a JSON number: its
// exact value by math/big, as plain digits when it is an integer of at most
// 20 digits, else "" (refused). Numbers too long to expand cheaply are
// judged by their exponent alone.
func integerOracle(t *testing.T, num string) string {
	mant, exp, _ := strings.Cut(strings.ToLower(num), "e")
	if n, err := strconv.Atoi(exp); exp != "" && (err != nil || n > 100 || n < -100) || len(mant) > 200 {
		return oracleSkip
	}
	var r big.Rat
	if _, ok := r.SetString(num); !ok {
		t.Fatalf("math/big cannot read JSON number %q", num)
	}
	if !r.IsInt() {
		return ""
	}
	s := r.Num().String()
	if len(strings.TrimPrefix(s, "-")) > 20 {
		return ""
	}
	return s
}

// oracleSkip marks a number the oracle does not judge.
const oracleSkip = "\x00skip"
