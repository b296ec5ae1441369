package ceiling

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// JWTClaim returns a [KeyFunc] that keys by a claim of a verified JSON Web
// Token: "sub" for the account, or any claim naming what a budget belongs
// to.
//
// Only a token that verifies counts: keyfunc returns the verification key
// ([jwt.Keyfunc]) and methods lists the accepted signing algorithms, so a
// token cannot choose its own ("none"). A token that does not verify, is
// expired or oversized ([JWTMaxSize]), or lacks a string or number claim
// yields [ErrNoKey]: forged subjects buy no fresh budget. The token comes
// from "Authorization: Bearer" unless [JWTFromHeader] or [JWTFromCookie]
// says otherwise. The KeyFunc is safe for simultaneous use if keyfunc is.
func JWTClaim(claim string, keyfunc jwt.Keyfunc, methods []string, opts ...JWTOption) (KeyFunc, error) {
	if claim == "" {
		return nil, errors.New("ceiling: JWTClaim: no claim name")
	}
	if keyfunc == nil {
		return nil, fmt.Errorf("ceiling: JWTClaim(%q): nil key function", claim)
	}
	if len(methods) == 0 {
		return nil, fmt.Errorf("ceiling: JWTClaim(%q): no valid signing methods", claim)
	}
	for _, m := range methods {
		if m == "none" || jwt.GetSigningMethod(m) == nil {
			return nil, fmt.Errorf("ceiling: JWTClaim(%q): signing method %q is not accepted", claim, m)
		}
	}
	k := &jwtKey{claim: claim, keyfunc: keyfunc, token: bearer("Authorization"), maxSize: defaultJWTMaxSize}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("ceiling: JWTClaim(%q): nil option", claim)
		}
		if err := o(k); err != nil {
			return nil, fmt.Errorf("ceiling: JWTClaim(%q): %w", claim, err)
		}
	}
	if err := refusesExpired(k.extra); err != nil {
		return nil, fmt.Errorf("ceiling: JWTClaim(%q): %w", claim, err)
	}
	// Ours come last so that no extra option can widen the methods.
	popts := append(append([]jwt.ParserOption(nil), k.extra...), jwt.WithValidMethods(methods), jwt.WithJSONNumber())
	k.parser = jwt.NewParser(popts...)
	return k.key, nil
}

// JWTSubject is [JWTClaim] for the "sub" claim: the verified account.
func JWTSubject(keyfunc jwt.Keyfunc, methods []string, opts ...JWTOption) (KeyFunc, error) {
	return JWTClaim("sub", keyfunc, methods, opts...)
}

// A JWTOption configures [JWTClaim].
type JWTOption func(*jwtKey) error

// JWTFromHeader reads the token from the named header, after an optional
// "Bearer " scheme.
func JWTFromHeader(name string) JWTOption {
	return func(k *jwtKey) error {
		if name == "" {
			return errors.New("JWTFromHeader: no header name")
		}
		k.token = bearer(http.CanonicalHeaderKey(name))
		return nil
	}
}

// JWTFromCookie reads the token from the named cookie.
func JWTFromCookie(name string) JWTOption {
	return func(k *jwtKey) error {
		if name == "" {
			return errors.New("JWTFromCookie: no cookie name")
		}
		k.token = func(r *http.Request, _ int) string {
			c, err := r.Cookie(name)
			if err != nil {
				return ""
			}
			return c.Value
		}
		return nil
	}
}

const defaultJWTMaxSize = 8 << 10

// JWTMaxSize sets the longest token, in bytes, that [JWTClaim] parses
// (default 8 KiB); a longer one yields [ErrNoKey] unread.
func JWTMaxSize(n int) JWTOption {
	return func(k *jwtKey) error {
		if n < 16 {
			return fmt.Errorf("JWTMaxSize(%d): a token needs at least 16 bytes", n)
		}
		k.maxSize = n
		return nil
	}
}

// errTokenTooLarge is what a token over the size limit yields: no key, as
// for any token that does not verify, without an allocation per refusal.
var errTokenTooLarge = fmt.Errorf("%w: jwt: token over the size limit", ErrNoKey)

// JWTParserOptions adds golang-jwt parser options, such as
// jwt.WithAudience, jwt.WithIssuer or jwt.WithExpirationRequired. Options
// that let an expired token through (jwt.WithoutClaimsValidation, a leeway of
// decades) make [JWTClaim] return an error.
func JWTParserOptions(opts ...jwt.ParserOption) JWTOption {
	return func(k *jwtKey) error {
		k.extra = append(k.extra, opts...)
		return nil
	}
}

type jwtKey struct {
	claim   string
	keyfunc jwt.Keyfunc
	token   func(r *http.Request, maxSize int) string
	extra   []jwt.ParserOption
	parser  *jwt.Parser
	maxSize int
}

func (k *jwtKey) key(r *http.Request) (string, error) {
	raw := k.token(r, k.maxSize)
	if raw == "" {
		return "", ErrNoKey
	}
	if len(raw) > k.maxSize {
		return "", errTokenTooLarge
	}
	claims := jwt.MapClaims{}
	if _, err := k.parser.ParseWithClaims(raw, claims, k.keyfunc); err != nil {
		return "", fmt.Errorf("%w: jwt: %w", ErrNoKey, err)
	}
	switch v := claims[k.claim].(type) {
	case string:
		if v != "" {
			return v, nil
		}
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("%w: jwt: claim %q is missing or not a string or number", ErrNoKey, k.claim)
}

// schemeSlack is how much longer than the token size limit a header value
// may be for its scheme ("Bearer ") and surrounding space: a longer value is
// refused without being looked at.
const schemeSlack = 64

// bearer reads a token from a header, after an optional "Bearer " scheme. A
// value too long to hold a token of maxSize bytes is returned untrimmed, for
// the caller to refuse, so that refusing costs the same whatever its length.
func bearer(name string) func(*http.Request, int) string {
	return func(r *http.Request, maxSize int) string {
		vs := r.Header[name]
		if len(vs) == 0 {
			return ""
		}
		if len(vs[0]) > maxSize+schemeSlack {
			return vs[0]
		}
		v := strings.TrimSpace(vs[0])
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			v = strings.TrimSpace(v[7:])
		}
		return v
	}
}

// refusesExpired proves that the parser options still reject a token that
// expired in 1970, by parsing one signed with a throw-away key.
func refusesExpired(extra []jwt.ParserOption) error {
	secret := make([]byte, 32)
	rand.Read(secret)
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"exp": 1}).SignedString(secret)
	if err != nil {
		return err
	}
	p := jwt.NewParser(append(append([]jwt.ParserOption(nil), extra...), jwt.WithValidMethods([]string{"HS256"}))...)
	_, err = p.Parse(tok, func(*jwt.Token) (any, error) { return secret, nil })
	if err == nil {
		return errors.New("the parser options accept expired tokens (jwt.WithoutClaimsValidation, or a huge leeway)")
	}
	return nil
}
