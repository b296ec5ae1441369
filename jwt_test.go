package ceiling

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var testJWTSecret = []byte("ceiling-test-secret-0123456789abcdef")

func hmacKey(*jwt.Token) (any, error) { return testJWTSecret, nil }

func sign(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearerRequest(token string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "203.0.113.9:1"
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func TestJWTClaimOnlyFromVerifiedTokens(t *testing.T) {
	now := time.Now()
	hs := jwt.SigningMethodHS256
	ok := func(c jwt.MapClaims) jwt.MapClaims {
		c["exp"] = now.Add(time.Hour).Unix()
		return c
	}
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	sub := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	dest := Must(JWTClaim("dest", hmacKey, []string{"HS256"}))
	es := Must(JWTClaim("sub", func(*jwt.Token) (any, error) { return &ecKey.PublicKey, nil }, []string{"ES256"}))

	for _, tc := range []struct {
		name  string
		fn    KeyFunc
		token string
		want  string // "" for ErrNoKey
	}{
		{"valid", sub, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": "alice"})), "alice"},
		{"another claim", dest, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": "u1", "dest": "https://shop-1.myshopify.com"})), "https://shop-1.myshopify.com"},
		{"numeric claim", sub, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": 12345678901234567})), "12345678901234567"},
		{"no expiry is not required by default", sub, sign(t, hs, testJWTSecret, jwt.MapClaims{"sub": "alice"}), "alice"},
		{"asymmetric", es, sign(t, jwt.SigningMethodES256, ecKey, ok(jwt.MapClaims{"sub": "carol"})), "carol"},

		{"no token", sub, "", ""},
		{"expired", sub, sign(t, hs, testJWTSecret, jwt.MapClaims{"sub": "alice", "exp": now.Add(-time.Minute).Unix()}), ""},
		{"not yet valid", sub, sign(t, hs, testJWTSecret, jwt.MapClaims{"sub": "alice", "nbf": now.Add(time.Hour).Unix()}), ""},
		{"wrong key", sub, sign(t, hs, []byte("attacker-secret-attacker-secret!"), ok(jwt.MapClaims{"sub": "alice"})), ""},
		{"alg none", sub, sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, ok(jwt.MapClaims{"sub": "alice"})), ""},
		{"method not listed", sub, sign(t, jwt.SigningMethodHS384, testJWTSecret, ok(jwt.MapClaims{"sub": "alice"})), ""},
		{"HS256 signed with the public key", es, sign(t, hs, pub, ok(jwt.MapClaims{"sub": "alice"})), ""},
		{"claim missing", dest, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": "alice"})), ""},
		{"claim empty", sub, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": ""})), ""},
		{"claim an object", sub, sign(t, hs, testJWTSecret, ok(jwt.MapClaims{"sub": map[string]any{"id": 1}})), ""},
		{"not a JWT", sub, "hello.world", ""},
	} {
		got, err := tc.fn(bearerRequest(tc.token))
		if tc.want == "" {
			if !errors.Is(err, ErrNoKey) {
				t.Errorf("%s: key %q, err %v; want ErrNoKey", tc.name, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: key %q, err %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

func TestJWTTokenSources(t *testing.T) {
	tok := sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice"})
	lower := httptest.NewRequest("GET", "/", nil)
	lower.Header.Set("Authorization", "bearer  "+tok)
	if got := mustKey(t, Must(JWTClaim("sub", hmacKey, []string{"HS256"})), lower); got != "alice" {
		t.Errorf("lower-case scheme: key %q", got)
	}
	hdr := httptest.NewRequest("GET", "/", nil)
	hdr.Header.Set("X-Shopify-Session", tok)
	if got := mustKey(t, Must(JWTClaim("sub", hmacKey, []string{"HS256"}, JWTFromHeader("x-shopify-session"))), hdr); got != "alice" {
		t.Errorf("header: key %q", got)
	}
	ck := httptest.NewRequest("GET", "/", nil)
	ck.AddCookie(&http.Cookie{Name: "session", Value: tok})
	fn := Must(JWTClaim("sub", hmacKey, []string{"HS256"}, JWTFromCookie("session")))
	if got := mustKey(t, fn, ck); got != "alice" {
		t.Errorf("cookie: key %q", got)
	}
	if _, err := fn(bearerRequest(tok)); err != ErrNoKey {
		t.Errorf("cookie source ignores Authorization: err = %v", err)
	}
}

func TestJWTClaimConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		claim   string
		kf      jwt.Keyfunc
		methods []string
		opts    []JWTOption
		want    string
	}{
		{"", hmacKey, []string{"HS256"}, nil, "no claim name"},
		{"sub", nil, []string{"HS256"}, nil, "nil key function"},
		{"sub", hmacKey, nil, nil, "no valid signing methods"},
		{"sub", hmacKey, []string{"none"}, nil, `"none" is not accepted`},
		{"sub", hmacKey, []string{"HS257"}, nil, `"HS257" is not accepted`},
		{"sub", hmacKey, []string{"HS256"}, []JWTOption{JWTParserOptions(jwt.WithoutClaimsValidation())}, "expired"},
		{"sub", hmacKey, []string{"HS256"}, []JWTOption{JWTParserOptions(jwt.WithLeeway(100 * 365 * 24 * time.Hour))}, "expired"},
		{"sub", hmacKey, []string{"HS256"}, []JWTOption{JWTFromHeader("")}, "no header name"},
	} {
		_, err := JWTClaim(tc.claim, tc.kf, tc.methods, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "ceiling: JWTClaim") {
			t.Errorf("%q %v: error %v, want one saying %s", tc.claim, tc.methods, err, tc.want)
		}
	}
	// Tightening options are fine, and a parser option cannot widen the methods.
	fn, err := JWTClaim("sub", hmacKey, []string{"HS256"}, JWTParserOptions(jwt.WithAudience("api"), jwt.WithValidMethods([]string{"HS384"})))
	if err != nil {
		t.Fatal(err)
	}
	good := sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice", "aud": "api"})
	if got := mustKey(t, fn, bearerRequest(good)); got != "alice" {
		t.Errorf("key %q", got)
	}
	wide := sign(t, jwt.SigningMethodHS384, testJWTSecret, jwt.MapClaims{"sub": "alice", "aud": "api"})
	if _, err := fn(bearerRequest(wide)); !errors.Is(err, ErrNoKey) {
		t.Errorf("HS384 accepted through a parser option: %v", err)
	}
}

// TestForgedJWTSubjectsBuyNoQuota: an attacker signs tokens with fresh random
// subjects under its own key, with alg=none, or expired; every one falls back
// to the client address and its budget, through the middleware and the
// default memory store.
func TestForgedJWTSubjectsBuyNoQuota(t *testing.T) {
	user := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	h := MustNew([]Rule{
		{Name: "caller", Key: FirstOf(user, RemoteAddr), Limit: 3, Period: time.Hour, Algorithm: SlidingLog},
	}).Handler(okHandler)
	forge := []func(sub string) string{
		func(sub string) string {
			return sign(t, jwt.SigningMethodHS256, []byte("attacker-key-attacker-key-attack"), jwt.MapClaims{"sub": sub})
		},
		func(sub string) string {
			return sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": sub})
		},
		func(sub string) string {
			return sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(-time.Second).Unix()})
		},
	}
	var reqs []*http.Request
	for i := range 9 {
		reqs = append(reqs, bearerRequest(forge[i%3](fmt.Sprintf("user-%d-%d", i, time.Now().UnixNano()))))
	}
	if got, want := statuses(t, h, reqs...), []int{200, 200, 200, 429, 429, 429, 429, 429, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	// A genuine user from the same address has a budget of their own.
	real := bearerRequest(sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice"}))
	if got := statuses(t, h, real); got[0] != 200 {
		t.Errorf("verified user: status %d, want 200", got[0])
	}
}

// paddedToken is a genuine HS256 token of exactly size bytes: a "pad" claim
// takes up the room.
func paddedToken(t testing.TB, size int) string {
	t.Helper()
	claims := jwt.MapClaims{"sub": "alice", "pad": ""}
	base := len(sign(t, jwt.SigningMethodHS256, testJWTSecret, claims))
	// Base64 turns 3 bytes into 4: grow the pad until the token fits exactly.
	for n := (size - base) * 3 / 4; n >= 0; n++ {
		claims["pad"] = strings.Repeat("x", n)
		tok := sign(t, jwt.SigningMethodHS256, testJWTSecret, claims)
		if len(tok) == size {
			return tok
		}
		if len(tok) > size {
			break
		}
	}
	t.Fatalf("no token of exactly %d bytes", size)
	return ""
}

// TestJWTOversizedTokensRefusedUnread pins issue 14's third finding: a token
// over the size limit is no key (the rule is skipped, as for any token that
// does not verify), refused before the key function or the parser sees it,
// even when it is genuinely signed; one at the limit is parsed.
func TestJWTOversizedTokensRefusedUnread(t *testing.T) {
	var keyCalls int
	counting := func(tok *jwt.Token) (any, error) { keyCalls++; return testJWTSecret, nil }
	def := Must(JWTClaim("sub", counting, []string{"HS256"}))
	cookie := Must(JWTClaim("sub", counting, []string{"HS256"}, JWTFromCookie("session")))
	small := Must(JWTClaim("sub", counting, []string{"HS256"}, JWTMaxSize(1024)))
	large := Must(JWTClaim("sub", counting, []string{"HS256"}, JWTMaxSize(64<<10)))
	atLimit, overLimit := paddedToken(t, defaultJWTMaxSize), paddedToken(t, defaultJWTMaxSize+1)
	withCookie := func(tok string) *http.Request {
		r := bearerRequest("")
		r.AddCookie(&http.Cookie{Name: "session", Value: tok})
		return r
	}
	for _, tc := range []struct {
		name  string
		fn    KeyFunc
		r     *http.Request
		want  string // "" for ErrNoKey
		calls int    // key function calls expected
	}{
		{"at the default limit", def, bearerRequest(atLimit), "alice", 1},
		{"one byte over the default limit", def, bearerRequest(overLimit), "", 0},
		{"over the limit, padded with space", def, bearerRequest("  " + overLimit + "  "), "", 0},
		{"a 930 KB unsigned token", def, bearerRequest("e30." + strings.Repeat("A", 930_000) + "."), "", 0},
		{"900,000 dots", def, bearerRequest(strings.Repeat(".", 900_000)), "", 0},
		{"900 KB of spaces", def, bearerRequest(strings.Repeat(" ", 900_000)), "", 0},
		{"over the limit in a cookie", cookie, withCookie(overLimit), "", 0},
		{"at the limit in a cookie", cookie, withCookie(atLimit), "alice", 1},
		{"over a lowered limit", small, bearerRequest(paddedToken(t, 1025)), "", 0},
		{"at a lowered limit", small, bearerRequest(paddedToken(t, 1024)), "alice", 1},
		{"over the default, under a raised limit", large, bearerRequest(overLimit), "alice", 1},
	} {
		keyCalls = 0
		got, err := tc.fn(tc.r)
		if tc.want == "" && !errors.Is(err, ErrNoKey) || tc.want != "" && (err != nil || got != tc.want) {
			t.Errorf("%s: key %q, err %v; want %q (empty: ErrNoKey)", tc.name, got, err, tc.want)
		}
		if keyCalls != tc.calls {
			t.Errorf("%s: the key function was called %d times, want %d", tc.name, keyCalls, tc.calls)
		}
	}
	if _, err := JWTClaim("sub", hmacKey, []string{"HS256"}, JWTMaxSize(15)); err == nil || !strings.Contains(err.Error(), "JWTMaxSize(15)") {
		t.Errorf("JWTMaxSize(15): err = %v, want a configuration error", err)
	}
}

// TestJWTOversizedTokensFallBackToTheAddress: through the middleware, a flood
// of huge tokens is neither a 400 nor fresh budget: the address rule applies.
func TestJWTOversizedTokensFallBackToTheAddress(t *testing.T) {
	user := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	h := MustNew([]Rule{
		{Name: "caller", Key: FirstOf(user, RemoteAddr), Limit: 2, Period: time.Hour, Algorithm: SlidingLog},
	}).Handler(okHandler)
	huge := paddedToken(t, 64<<10)
	var reqs []*http.Request
	for range 3 {
		reqs = append(reqs, bearerRequest(huge))
	}
	if got, want := statuses(t, h, reqs...), []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// BenchmarkJWTOversized times refusing a 930 KB token (the flood)
// against parsing it, as the key function would without the size limit.
func BenchmarkJWTOversized(b *testing.B) {
	tok := "e30." + strings.Repeat("A", 930_000) + "."
	for _, bc := range []struct {
		name string
		fn   KeyFunc
	}{
		{"refused", Must(JWTClaim("sub", hmacKey, []string{"HS256"}))},
		{"parsed", Must(JWTClaim("sub", hmacKey, []string{"HS256"}, JWTMaxSize(1<<20)))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := bearerRequest(tok)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.fn(r); !errors.Is(err, ErrNoKey) {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkJWTClaim(b *testing.B) {
	fn := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	r := bearerRequest(sign(b, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fn(r); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzJWTClaim mutates tokens, genuine and forged: whatever the bytes, the
// key is either the subject of the one token the server signed, or
// ErrNoKey. Never a 400, never a forged subject, never a panic.
func FuzzJWTClaim(f *testing.F) {
	genuine := sign(f, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice"})
	f.Add(genuine)
	f.Add("Bearer " + genuine)
	f.Add(sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "mallory"}))
	f.Add(sign(f, jwt.SigningMethodHS256, []byte("attacker-key-attacker-key-attack"), jwt.MapClaims{"sub": "mallory"}))
	f.Add(sign(f, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice", "exp": 1}))
	f.Add("e30.e30.")
	// Oversized: a genuine token one byte over the limit, junk, dots.
	f.Add(paddedToken(f, defaultJWTMaxSize+1))
	f.Add("e30." + strings.Repeat("A", 20_000) + ".")
	f.Add(strings.Repeat(".", 10_000))
	fn := Must(JWTClaim("sub", hmacKey, []string{"HS256"}))
	f.Fuzz(func(t *testing.T, token string) {
		r := bearerRequest("")
		r.Header.Set("Authorization", "Bearer "+token)
		got, err := fn(r)
		if err != nil {
			if !errors.Is(err, ErrNoKey) {
				t.Fatalf("token %q: error %v is not ErrNoKey", token, err)
			}
			return
		}
		if got != "alice" {
			t.Fatalf("token %q: key %q from a token the server never signed", token, got)
		}
	})
}
