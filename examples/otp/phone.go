package main

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/ceiling-go/ceiling"
)

// maxBody bounds the request body: {"phone": "..."} fits many times over.
const maxBody = 1 << 10

// phoneField reads the body's "phone" once (however many rules ask) and
// leaves the identical bytes for the handler; a body over maxBody is an error
// wrapping [ceiling.ErrBodyTooLarge], so the middleware answers 413.
var phoneField = ceiling.MustBodyField("phone", ceiling.BodyLimit(maxBody))

// phoneKey keys by the destination phone number of the body, as digits, so
// that "+254 700 000 000" and "254700000000" share one budget. A malformed
// body or a missing or invalid number is an error, which the middleware
// answers with 400 (a body over maxBody: 413) before it asks Redis: bad
// input costs nothing and counts for nothing.
//
// A missing number is an error here, not [ceiling.ErrNoKey] as BodyField
// reports it: on this endpoint every request names a phone, and a request
// that does not must not slip past the per-phone rule.
func phoneKey(r *http.Request) (string, error) {
	v, err := phoneField(r)
	if errors.Is(err, ceiling.ErrNoKey) {
		return "", errors.New(`no "phone" in the body`)
	}
	if err != nil {
		return "", err
	}
	return normalPhone(v)
}

// normalPhone returns the digits of an international number: 8 to 15 of
// them (E.164 allows at most 15), spaces and "+-.()" dropped, anything else
// refused.
func normalPhone(s string) (string, error) {
	if s == "" {
		return "", errors.New(`no "phone" in the body`)
	}
	d, err := ceiling.Digits(s)
	if err != nil {
		return "", err
	}
	if len(d) < 8 || len(d) > 15 {
		return "", fmt.Errorf("a phone number has 8 to 15 digits, this one %d", len(d))
	}
	return d, nil
}

// maskPhone hides all but the country code's first digits and the last two,
// for logs: "254700000012" becomes "2547******12".
func maskPhone(digits string) string {
	if len(digits) <= 6 {
		return "******"
	}
	b := []byte(digits)
	for i := 4; i < len(b)-2; i++ {
		b[i] = '*'
	}
	return string(b)
}
