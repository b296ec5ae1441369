package main

import (
	"strings"
	"testing"
)

// FuzzNormalPhone: whatever the spelling, a number either is refused or
// comes out in E.164 ("+", then at most 15 digits), and its E.164 form
// reads back as itself, so that the key, the SMS and the log all name one
// handset.
func FuzzNormalPhone(f *testing.F) {
	for _, s := range []string{
		"+44 7400 900777", "0044 7400 900777", "+44 (0)7400 900777", "00044 7400 900777", "+0447400900777",
		"07400 900777", "+44 7700 900777", "+254 700 000 000", "254-700-000-000", "(254) 700.000.000",
		"+２５４ 700 000 000", "+254 7OO", "+1 800 FLOWERS", "+254 700 000 000 ext. 12", "", "+", "00", "+1 (((",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, region := range []string{"", "GB"} {
			e164, err := normalPhone(s, region)
			if err != nil {
				continue
			}
			digits := strings.TrimPrefix(e164, "+")
			if !strings.HasPrefix(e164, "+") || len(digits) == 0 || len(digits) > 15 || strings.Trim(digits, "0123456789") != "" {
				t.Fatalf("%q in %q: %q is not E.164", s, region, e164)
			}
			if again, err := normalPhone(e164, ""); err != nil || again != e164 {
				t.Fatalf("%q in %q: %q reads back as %q, %v", s, region, e164, again, err)
			}
		}
	})
}
