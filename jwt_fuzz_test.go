package ceiling

import (
	"errors"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

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
