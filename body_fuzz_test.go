package ceiling

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// FuzzBodyField checks the body-field key against encoding/json, which most
// handlers use: whenever the limiter finds a key, the handler decoding the
// same bytes into a struct finds the same value; whenever the limiter finds
// none, neither does the handler; and the handler always reads the bytes
// that were sent.
func FuzzBodyField(f *testing.F) {
	for _, s := range []string{
		`{"phone": "+254700000000"}`, `{"Phone": 254700000000}`, `{"phone": "a", "PHONE": "b"}`,
		`{"phone": null}`, `{"phone": {"x": 1}}`, `{"user": {"id": "u1"}}`, `[1, 2]`, `"str"`, ``,
		`{"phone": "\u0041\ud800"}`, `{"phone": true} x`, `{"pho\u006ee": "1"}`,
		// Numeric spellings of one value, fractions, huge exponents.
		`{"phone": 1000}`, `{"phone": 1000.0}`, `{"phone": 1e3}`, `{"phone": 10E2}`, `{"phone": 15550001111.0}`,
		`{"phone": -0.0}`, `{"phone": 1.5}`, `{"phone": 1e999999999}`, `{"phone": 18446744073709551615}`,
	} {
		f.Add(s)
	}
	phone, form := Must(BodyField("phone")), Must(FormField("phone"))
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		got, err := phone(r)
		if rest, _ := io.ReadAll(r.Body); string(rest) != body {
			t.Fatalf("handler reads %q, sent %q", rest, body)
		}
		if errors.Is(err, ErrBodyTooLarge) {
			return
		}
		var handler struct {
			Phone any `json:"phone"`
		}
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		herr := dec.Decode(&handler)
		if herr == nil && dec.More() {
			herr = errors.New("trailing data")
		}
		hv := ""
		switch v := handler.Phone.(type) {
		case string:
			hv = v
		case json.Number:
			// Keyed by value: the integer's plain digits, or refused.
			hv = integerOracle(t, v.String())
		case bool:
			hv = "false"
			if v {
				hv = "true"
			}
		}
		switch {
		case hv == oracleSkip:
			if err == nil && len(got) > 21 {
				t.Fatalf("body %q: limiter keys a %d-byte number", body, len(got))
			}
		case err == nil:
			if herr != nil || hv != got {
				t.Fatalf("body %q: limiter keys %q, handler decodes %q (%v)", body, got, hv, herr)
			}
		case errors.Is(err, ErrNoKey):
			if len(bytes.TrimSpace([]byte(body))) > 0 && herr == nil && hv != "" {
				t.Fatalf("body %q: limiter has no key, handler decodes %q", body, hv)
			}
		}

		fr := httptest.NewRequest("POST", "/", strings.NewReader(body))
		fr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		fk, ferr := form(fr)
		if rest, _ := io.ReadAll(fr.Body); string(rest) != body {
			t.Fatalf("form: handler reads %q, sent %q", rest, body)
		}
		if ferr == nil {
			fr2 := httptest.NewRequest("POST", "/", strings.NewReader(body))
			fr2.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if v := fr2.FormValue("phone"); v != fk {
				t.Fatalf("form %q: limiter keys %q, FormValue %q", body, fk, v)
			}
		}
	})
}

// integerOracle is the key an independent reading gives a JSON number: its
// exact value by math/big, as plain digits when it is an integer of at most
// 20 digits, else "" (refused). Numbers too long to expand cheaply are
// judged by their exponent alone.
func integerOracle(t *testing.T, num string) string {
	mant, exp, _ := strings.Cut(strings.ToLower(num), "e")
	if n, err := strconv.Atoi(exp); exp != "" && (err != nil || n > 100 || n < -100) || len(mant) > 200 {
		return oracleSkip
	}
	var r big.Rat
	if _, ok := r.SetString(num); !ok {
		t.Fatalf("math/big cannot read JSON number %q", num)
	}
	if !r.IsInt() {
		return ""
	}
	s := r.Num().String()
	if len(strings.TrimPrefix(s, "-")) > 20 {
		return ""
	}
	return s
}

// oracleSkip marks a number the oracle does not judge.
const oracleSkip = "\x00skip"
