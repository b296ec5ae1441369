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
	sub := MustJWTClaim("sub", hmacKey, []string{"HS256"})
	dest := MustJWTClaim("dest", hmacKey, []string{"HS256"})
	es := MustJWTClaim("sub", func(*jwt.Token) (any, error) { return &ecKey.PublicKey, nil }, []string{"ES256"})

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
	if got := mustKey(t, MustJWTClaim("sub", hmacKey, []string{"HS256"}), lower); got != "alice" {
		t.Errorf("lower-case scheme: key %q", got)
	}
	hdr := httptest.NewRequest("GET", "/", nil)
	hdr.Header.Set("X-Shopify-Session", tok)
	if got := mustKey(t, MustJWTClaim("sub", hmacKey, []string{"HS256"}, JWTFromHeader("x-shopify-session")), hdr); got != "alice" {
		t.Errorf("header: key %q", got)
	}
	ck := httptest.NewRequest("GET", "/", nil)
	ck.AddCookie(&http.Cookie{Name: "session", Value: tok})
	fn := MustJWTClaim("sub", hmacKey, []string{"HS256"}, JWTFromCookie("session"))
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
	user := MustJWTClaim("sub", hmacKey, []string{"HS256"})
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
	if got, want := statuses(t, h, reqs...), []int{200, 200, 200, 429, 429, 429, 429, 429, 429}; !equalInts(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	// A genuine user from the same address has a budget of their own.
	real := bearerRequest(sign(t, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice"}))
	if got := statuses(t, h, real); got[0] != 200 {
		t.Errorf("verified user: status %d, want 200", got[0])
	}
}

func BenchmarkJWTClaim(b *testing.B) {
	fn := MustJWTClaim("sub", hmacKey, []string{"HS256"})
	r := bearerRequest(sign(b, jwt.SigningMethodHS256, testJWTSecret, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fn(r); err != nil {
			b.Fatal(err)
		}
	}
}
