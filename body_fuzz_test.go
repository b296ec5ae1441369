package ceiling

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
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
	} {
		f.Add(s)
	}
	phone, form := MustBodyField("phone"), MustFormField("phone")
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
			hv = v.String()
		case bool:
			hv = "false"
			if v {
				hv = "true"
			}
		}
		switch {
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
