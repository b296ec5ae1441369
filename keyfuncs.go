package ceiling

import (
	"errors"
	"net/http"
)

// A KeyFunc returns the value a rule limits by: a client address, an account,
// a phone number. ceiling never stores it raw (see [WithKeySecret]).
//
// Returning an error wrapping [ErrNoKey] means the rule does not apply to this
// request (an anonymous caller for a per-user rule) and the rule is left out
// of the decision. Any other error is bad input: the request is answered 400
// (413 when it wraps [ErrBodyTooLarge]) before any backend call.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is returned by a [KeyFunc] when its rule does not apply to the
// request.
var ErrNoKey = errors.New("ceiling: no key")

// ErrBodyTooLarge is returned (wrapped) by key functions that read a request
// body larger than their bound; the middleware answers 413.
var ErrBodyTooLarge = errors.New("ceiling: request body too large")

// Static keys every request the same: one budget shared by all callers.
func Static(value string) KeyFunc {
	return func(*http.Request) (string, error) { return value, nil }
}
