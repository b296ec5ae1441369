package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode"

	"github.com/ceiling-go/ceiling"
	"github.com/nyaruka/phonenumbers"
)

// maxBody bounds the request body: {"phone": "..."} fits many times over.
const maxBody = 1 << 10

// phoneField reads the body's "phone" once (however many rules ask) and
// leaves the identical bytes for the handler; a body over maxBody is an error
// wrapping [ceiling.ErrBodyTooLarge], so the middleware answers 413.
var phoneField = ceiling.Must(ceiling.BodyField("phone", ceiling.BodyLimit(maxBody)))

// phoneKey returns the key function of the destination phone number, read
// in region when it is written nationally (see normalPhone). The limiter
// keys on it and the handler sends to it: the number counted is, digit for
// digit, the number texted. A malformed body or a missing or invalid number
// is an error, which the middleware answers with 400 (a body over maxBody:
// 413) before it asks Redis: bad input costs nothing and counts for nothing.
//
// A missing number is an error here, not [ceiling.ErrNoKey] as BodyField
// reports it: on this endpoint every request names a phone, and a request
// that does not must not slip past the per-phone rule.
func phoneKey(region string) ceiling.KeyFunc {
	return func(r *http.Request) (string, error) {
		v, err := phoneField(r)
		if errors.Is(err, ceiling.ErrNoKey) {
			return "", errors.New(`no "phone" in the body`)
		}
		if err != nil {
			return "", err
		}
		return normalPhone(v, region)
	}
}

// normalPhone returns the number s names in E.164 ("+447400123456"), the
// one spelling of a handset: "+44 7400 123456", "0044 7400 123456" (from a
// region whose international prefix is 00) and "+44 (0)7400 123456" are
// one number and one budget. It parses with phonenumbers, the Go port of
// Google's libphonenumber, which knows every country's code, trunk prefix
// and number plan; ceiling.Digits, which only drops punctuation, would make
// each of those spellings a fresh budget for the same handset.
//
// A number without "+" is read as dialled in region (an ISO 3166 code such
// as "GB"); with region "" it must be international. A number that is not
// valid in its country's plan (too short, an unassigned range, the
// fictional 07700 900xxx), one with an extension, and one with letters
// ("1-800-FLOWERS" names another number than it shows, and "7OO" is not
// "700") are refused.
func normalPhone(s, region string) (string, error) {
	if strings.TrimSpace(s) == "" {
		return "", errors.New(`no "phone" in the body`)
	}
	if strings.IndexFunc(s, unicode.IsLetter) >= 0 {
		return "", errors.New("not a phone number: letters are not allowed")
	}
	n, err := phonenumbers.Parse(s, region)
	if err != nil || !phonenumbers.IsValidNumber(n) {
		if region == "" && !strings.HasPrefix(strings.TrimSpace(s), "+") {
			return "", errors.New("not a valid phone number: give it with its country code (+44 ...)")
		}
		return "", errors.New("not a valid phone number")
	}
	if n.GetExtension() != "" {
		return "", errors.New("not a phone number for SMS: it has an extension")
	}
	return phonenumbers.Format(n, phonenumbers.E164), nil
}

// checkRegion reports whether region is one phonenumbers can read national
// numbers of ("" for none).
func checkRegion(region string) error {
	if region == "" || phonenumbers.GetCountryCodeForRegion(region) != 0 {
		return nil
	}
	return fmt.Errorf("OTP_DEFAULT_REGION=%q: not a region phone numbers know; use an ISO 3166 code such as GB or KE", region)
}

// maskPhone hides all but the country code's first digits and the last two,
// for logs: "+254700000012" becomes "+254*******12".
func maskPhone(e164 string) string {
	if len(e164) <= 6 {
		return "******"
	}
	b := []byte(e164)
	for i := 4; i < len(b)-2; i++ {
		b[i] = '*'
	}
	return string(b)
}
