package ceiling

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHeaderAndQueryValues(t *testing.T) {
	r := httptest.NewRequest("GET", "/?to=%2B254700&empty=&dup=a&dup=b&same=x&same=x", nil)
	r.Header.Set("X-Api-Key", "k1")
	r.Header["X-Dup"] = []string{"a", "b"}
	r.Header["X-Blank-First"] = []string{"", "b"}
	for _, tc := range []struct {
		name string
		fn   KeyFunc
		want string
		err  error // ErrNoKey, or errBad for a 400
	}{
		{"header", Header("x-api-key"), "k1", nil},
		{"missing header", Header("X-Other"), "", ErrNoKey},
		{"repeated header", Header("X-Dup"), "", errBad},
		{"empty, then a value", Header("X-Blank-First"), "", errBad},
		{"query", Query("to"), "+254700", nil},
		{"missing query", Query("from"), "", ErrNoKey},
		{"empty query", Query("empty"), "", ErrNoKey},
		{"repeated query", Query("dup"), "", errBad},
		{"repeated equal query", Query("same"), "x", nil},
	} {
		got, err := tc.fn(r)
		checkKey(t, tc.name, got, err, tc.want, tc.err)
	}
	noQuery := httptest.NewRequest("GET", "/", nil)
	if _, err := Query("to")(noQuery); err != ErrNoKey {
		t.Errorf("no query string: err = %v, want ErrNoKey", err)
	}
}

// errBad stands for "any error that is not ErrNoKey" in tables.
var errBad = errors.New("bad input")

func checkKey(t *testing.T, name, got string, err error, want string, wantErr error) {
	t.Helper()
	switch {
	case wantErr == nil && err != nil:
		t.Errorf("%s: err = %v, want key %q", name, err, want)
	case wantErr == ErrNoKey && !errors.Is(err, ErrNoKey):
		t.Errorf("%s: key %q, err %v; want ErrNoKey", name, got, err)
	case wantErr == errBad && (err == nil || errors.Is(err, ErrNoKey)):
		t.Errorf("%s: key %q, err %v; want a bad-input error", name, got, err)
	case wantErr == nil && got != want:
		t.Errorf("%s: key %q, want %q", name, got, want)
	}
}

func TestJoinIsUnambiguous(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	ab_c := mustKey(t, Join(Static("a|b"), Static("c")), r)
	a_bc := mustKey(t, Join(Static("a"), Static("b|c")), r)
	if ab_c == a_bc {
		t.Errorf(`Join("a|b","c") = Join("a","b|c") = %q`, ab_c)
	}
	if x, y := mustKey(t, Join(Static("1:a"), Static("")), r), mustKey(t, Join(Static("1"), Static("a")), r); x == y {
		t.Errorf("Join collides on %q", x)
	}
	if got, want := mustKey(t, Join(Static("alice"), Static("POST /otp")), r), "5:alice9:POST /otp"; got != want {
		t.Errorf("Join = %q, want %q", got, want)
	}
}

func TestJoinStopsAtTheFirstMissingPart(t *testing.T) {
	called := false
	later := func(*http.Request) (string, error) { called = true; return "x", nil }
	r := httptest.NewRequest("GET", "/", nil)
	if _, err := Join(Header("X-User"), later)(r); err != ErrNoKey {
		t.Errorf("err = %v, want ErrNoKey", err)
	}
	if called {
		t.Error("Join called the part after a missing one")
	}
	bad := errors.New("boom")
	if _, err := Join(Static("a"), func(*http.Request) (string, error) { return "", bad })(r); err != bad {
		t.Errorf("err = %v, want the part's error", err)
	}
}

func TestFirstOfFallsBackInOrder(t *testing.T) {
	fn := FirstOf(Header("X-User"), RemoteAddr)
	anon := ipRequest("192.0.2.1:1")
	named := ipRequest("192.0.2.1:1", "X-User", "192.0.2.1")
	a, u := mustKey(t, fn, anon), mustKey(t, fn, named)
	if a == u {
		t.Errorf("user %q and the anonymous client at that address share key %q", "192.0.2.1", a)
	}
	if got, want := u, "0:192.0.2.1"; got != want {
		t.Errorf("user key %q, want %q", got, want)
	}
	if _, err := FirstOf(Header("X-A"), Header("X-B"))(anon); err != ErrNoKey {
		t.Errorf("no function has a key: err = %v, want ErrNoKey", err)
	}
	bad := errors.New("boom")
	if _, err := FirstOf(func(*http.Request) (string, error) { return "", bad }, RemoteAddr)(anon); err != bad {
		t.Errorf("err = %v: a bad-input error must not fall through", err)
	}
}

func TestSkipLeavesTheRuleOut(t *testing.T) {
	be := &quota{}
	health := func(r *http.Request) bool { return r.URL.Path == "/healthz" }
	h := MustNew([]Rule{{Name: "ip", Key: Skip(health, RemoteAddr), Limit: 1, Period: time.Minute}}, WithBackend(be)).Handler(okHandler)
	got := statuses(t, h,
		httptest.NewRequest("GET", "/healthz", nil),
		httptest.NewRequest("GET", "/healthz", nil),
		httptest.NewRequest("GET", "/x", nil),
		httptest.NewRequest("GET", "/x", nil),
		httptest.NewRequest("GET", "/healthz", nil))
	if want := []int{200, 200, 200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if got, want := be.calls, 2; got != want {
		t.Errorf("backend calls = %d, want %d (skipped requests cost nothing)", got, want)
	}
}

func TestNormalisersMakeOneKey(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	phone := func(v string) KeyFunc { return Normalize(Static(v), Digits) }
	want := mustKey(t, phone("254700000000"), r)
	for _, v := range []string{"+254 700 000 000", "+254-700-000-000", "(254) 700.000.000"} {
		if got := mustKey(t, phone(v), r); got != want {
			t.Errorf("Digits(%q) = %q, want %q", v, got, want)
		}
	}
	for _, v := range []string{"+254 7OO 000 000", "+254７００000000", "+", "call me"} {
		if got, err := phone(v)(r); err == nil || errors.Is(err, ErrNoKey) {
			t.Errorf("Digits(%q) = %q, %v; want a bad-input error", v, got, err)
		}
	}
	email := func(v string) KeyFunc { return Normalize(Static(v), Lower) }
	if a, b := mustKey(t, email(" Alice@Example.COM"), r), mustKey(t, email("alice@example.com"), r); a != b {
		t.Errorf("Lower: %q != %q", a, b)
	}
	if _, err := email("   ")(r); err != ErrNoKey {
		t.Errorf("blank after normalising: err = %v, want ErrNoKey", err)
	}
	if _, err := Normalize(Header("X-Phone"), Digits)(r); err != ErrNoKey {
		t.Errorf("missing value: err = %v, want ErrNoKey", err)
	}
}

// Through the middleware: two spellings of one phone number share the
// budget, and a malformed one is a 400 before any backend call.
func TestNormalisedPhoneSharesABudget(t *testing.T) {
	be := &quota{}
	h := MustNew([]Rule{{Name: "otp:to", Key: Normalize(Query("to"), Digits), Limit: 2, Period: time.Minute}}, WithBackend(be)).Handler(okHandler)
	got := statuses(t, h,
		httptest.NewRequest("POST", "/otp?to=%2B254+700+000+000", nil),
		httptest.NewRequest("POST", "/otp?to=254700000000", nil),
		httptest.NewRequest("POST", "/otp?to=254-700-000-000", nil),
		httptest.NewRequest("POST", "/otp?to=%2B254+7OO", nil))
	if want := []int{200, 200, 429, 400}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if be.calls != 3 {
		t.Errorf("backend calls = %d, want 3", be.calls)
	}
}

func TestCompositionPanicsOnMisuse(t *testing.T) {
	for name, f := range map[string]func(){
		"Join()":         func() { Join() },
		"Join(nil)":      func() { Join(Static("a"), nil) },
		"FirstOf()":      func() { FirstOf() },
		"Skip(nil)":      func() { Skip(nil, RemoteAddr) },
		"Normalize(nil)": func() { Normalize(RemoteAddr, nil) },
		`Header("")`:     func() { Header("") },
		`Query("")`:      func() { Query("") },
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.HasPrefix(p.(string), "ceiling: ") {
					t.Errorf("%s: panic %v, want a ceiling: message", name, p)
				}
			}()
			f()
		}()
	}
}

// Must hands back the key function when its constructor succeeded and
// panics with the constructor's own error when it did not.
func TestMust(t *testing.T) {
	fn := Must(FormField("user"))
	r := httptest.NewRequest("POST", "/", strings.NewReader("user=ann"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if got, want := mustKey(t, fn, r), "ann"; got != want {
		t.Errorf("Must(FormField(%q)) keyed %q, want %q", "user", got, want)
	}
	_, want := FormField("")
	defer func() {
		if got, ok := recover().(error); !ok || got.Error() != want.Error() {
			t.Errorf("Must(FormField(\"\")) panicked with %v, want %v", got, want)
		}
	}()
	Must(FormField(""))
}

// A Header key on a header that carries a client address, which any client
// can write, is the issue 26 trap: five spoofed values bought five fresh
// budgets in silence. It is logged once per process, pointing to ClientIP,
// whatever the name's case, and every limiter's health report keeps it;
// other headers raise nothing.
func TestHeaderOnAnAddressHeaderWarnsOnce(t *testing.T) {
	var logs bytes.Buffer
	saved, savedNotes := processLogger.Load(), spoofable.all()
	processLogger.Store(nil)
	spoofable = notes{}
	t.Cleanup(func() {
		processLogger.Store(saved)
		spoofable = notes{list: savedNotes, logged: len(savedNotes)}
	})

	Header("X-Api-Key")
	xff := Header("x-forwarded-for") // before any limiter: logged by New
	Header("X-Forwarded-For")        // the same warning: not repeated
	l := MustNew([]Rule{{Name: "by-xff", Key: xff, Limit: 2, Period: time.Minute}},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer l.Close()
	if !strings.Contains(logs.String(), `ceiling.Header(\"X-Forwarded-For\")`) {
		t.Errorf("New did not log the warning about a Header key built before it:\n%s", logs.String())
	}
	MustNew([]Rule{{Name: "other", Key: RemoteAddr, Limit: 2, Period: time.Minute}},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))).Close()
	Header("True-Client-IP") // after a limiter: logged at once

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `ceiling.Header(\"X-Forwarded-For\")`) ||
		!strings.Contains(lines[0], "ceiling.Must(ceiling.ClientIP(ceiling.TrustXForwardedFor(") ||
		!strings.Contains(lines[1], `ceiling.Header(\"True-Client-Ip\")`) || !strings.Contains(lines[1], `TrustHeader(\"True-Client-IP\"`) {
		t.Errorf("want one line for X-Forwarded-For, then one for True-Client-IP; logged:\n%s", logs.String())
	}
	var found int
	for _, w := range l.Health().Warnings {
		if strings.Contains(w, "ceiling.Header(") {
			found++
		}
	}
	if found != 2 {
		t.Errorf("Health().Warnings holds %d Header warnings, want 2: %q", found, l.Health().Warnings)
	}
}
