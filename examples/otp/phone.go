package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/ceiling-go/ceiling"
)

// maxBody bounds the request body: {"phone": "..."} fits many times over.
const maxBody = 1 << 10

// otpRequest is the body of POST /api/otp.
type otpRequest struct {
	Phone string `json:"phone"`
}

// phoneKey keys by the destination phone number of the body, as digits, so
// that "+254 700 000 000" and "254700000000" share one budget. A body over
// maxBody wraps [ceiling.ErrBodyTooLarge] (the middleware answers 413); a
// malformed body or a missing or invalid number is any other error (400).
// Both are answered before the limiter asks Redis: they cost nothing and
// count for nothing.
//
// It reads the body once and puts the same bytes back for the handler.
func phoneKey(r *http.Request) (string, error) {
	body, err := readBody(r)
	if err != nil {
		return "", err
	}
	var req otpRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return "", fmt.Errorf(`the body must be JSON: {"phone": "+254 700 000 000"}: %w`, err)
	}
	return normalPhone(req.Phone)
}

// readBody reads at most maxBody bytes of r's body and replaces the body
// with them, so that the handler reads what the key function read.
func readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength > maxBody {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ceiling.ErrBodyTooLarge, r.ContentLength, maxBody)
	}
	if r.Body == nil {
		return nil, errors.New("no body")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the body: %w", err)
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("%w: the limit is %d bytes", ceiling.ErrBodyTooLarge, maxBody)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
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
