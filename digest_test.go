package ceiling

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"testing"
	"time"
)

// With a key secret, the stored key is the first 16 bytes of the value's
// HMAC-SHA256. A short value must not shorten the digest: before the fix
// only len(value) bytes of the MAC were kept and the rest were zeros, so
// user ids "17" and "42" kept 16 bits each and collided easily.
func TestKeySecretDigestKeepsSixteenBytesOfShortValuesRegression(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	l := MustNew([]Rule{{Name: "user", Key: Static("x"), Limit: 1, Period: time.Second}}, WithKeySecret(secret), WithBackend(&scripted{}))
	for _, v := range []string{"", "7", "42", "10.0.0.1", "+254700000000", "a-user-id-longer-than-thirty-two-bytes-0123456789"} {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(v))
		want := "user:" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:digestLen])
		if got := l.request(&l.rules[0], v).Key; got != want {
			t.Errorf("stored key of %q = %q, want %q", v, got, want)
		}
	}
}
