package main

import (
	"errors"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// mintToken signs a token for user that expires after ttl: what the
// service's login would hand a signed-in user, for trying the otp:user rule
// by hand.
func mintToken(secret []byte, user string, ttl time.Duration) (string, error) {
	if user == "" {
		return "", errors.New("a token needs a user (sub)")
	}
	now := time.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   user,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}).SignedString(secret)
}
