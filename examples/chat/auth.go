package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// claims is what a verified token says: the shop the session belongs to
// (Shopify's "dest" claim) and the user.
type claims struct {
	Shop string `json:"dest"`
	jwt.RegisteredClaims
}

type claimsKey struct{}

// authenticate verifies the bearer token once per request and, when it is
// valid, puts its claims in the request's context for the rules and the
// handler. It rejects nothing: an unauthenticated request goes on so that
// the per-address rule still counts it, while the per-shop rules, which key
// on the verified claims only, leave it out, and the handler answers 401.
// So a forged token naming a shop spends none of that shop's budget.
//
// A token over maxToken bytes is refused unread, as an invalid one is: a
// real session token is a few hundred bytes, and a flood of megabyte
// tokens would otherwise cost milliseconds of base64 and JSON work each
// before the signature fails, starving the limiter's calls to Redis.
func authenticate(secret []byte, next http.Handler) http.Handler {
	parser := jwt.NewParser(jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired())
	keyfunc := func(*jwt.Token) (any, error) { return secret, nil }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, ok := bearerToken(r)
		if ok && len(raw) <= maxToken {
			var c claims
			if _, err := parser.ParseWithClaims(raw, &c, keyfunc); err == nil && c.Shop != "" && c.Subject != "" {
				r = r.WithContext(context.WithValue(r.Context(), claimsKey{}, &c))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// maxToken is the longest bearer token authenticate parses: 8 KiB, the
// size cap of the library's own JWT key functions.
const maxToken = 8 << 10

// bearerToken returns the token of "Authorization: Bearer <token>".
func bearerToken(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// claimsFrom returns the verified claims authenticate found, if any.
func claimsFrom(r *http.Request) (*claims, bool) {
	c, ok := r.Context().Value(claimsKey{}).(*claims)
	return c, ok
}

// mintToken signs a token for shop and user that expires after ttl: what
// the Shopify admin would hand the app, for trying the service by hand.
func mintToken(secret []byte, shop, user string, ttl time.Duration) (string, error) {
	if shop == "" || user == "" {
		return "", errors.New("a token needs a shop (dest) and a user (sub)")
	}
	now := time.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims{
		Shop: shop,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}).SignedString(secret)
}
