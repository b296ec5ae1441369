package transcript

import (
	"fmt"
	"strings"
)

// Match reports how got differs from want, the output a README shows, by
// the rules of the package doc; nil means it does not.
func Match(want, got string) error {
	got = strings.ReplaceAll(got, "\r\n", "\n")
	wantLines, gotLines := lines(want), lines(got)
	if len(wantLines) > 0 && strings.HasPrefix(wantLines[0], "HTTP/") {
		return matchResponse(wantLines, gotLines)
	}
	return matchLines(wantLines, gotLines)
}

// lines splits s into lines without their surrounding spaces, dropping
// trailing empty lines (a final newline, or none, is not compared).
func lines(s string) []string {
	ls := strings.Split(s, "\n")
	for i := range ls {
		ls[i] = strings.TrimSpace(ls[i])
	}
	for len(ls) > 0 && ls[len(ls)-1] == "" {
		ls = ls[:len(ls)-1]
	}
	return ls
}

// matchLines matches line by line, a "..." line taking any number of lines.
func matchLines(want, got []string) error {
	if matchFrom(want, got) {
		return nil
	}
	// Name the first line that differs, for the error.
	for i := range want {
		if want[i] == "..." {
			break
		}
		if i >= len(got) {
			return fmt.Errorf("output ends before line %d, want %q", i+1, want[i])
		}
		if !matchLine(want[i], got[i]) {
			return fmt.Errorf("line %d is %q, want %q", i+1, got[i], want[i])
		}
	}
	if !strings.Contains(strings.Join(want, "\n"), "...") && len(got) > len(want) {
		return fmt.Errorf("line %d is %q, want no more output", len(want)+1, got[len(want)])
	}
	return fmt.Errorf("output does not match")
}

func matchFrom(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "..." {
		for skip := 0; skip <= len(got); skip++ {
			if matchFrom(want[1:], got[skip:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && matchLine(want[0], got[0]) && matchFrom(want[1:], got[1:])
}

// matchLine matches one line, "[..]" standing for any text.
func matchLine(want, got string) bool {
	parts := strings.Split(want, "[..]")
	if len(parts) == 1 {
		return want == got
	}
	if !strings.HasPrefix(got, parts[0]) {
		return false
	}
	got = got[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(got, p)
		if i < 0 {
			return false
		}
		got = got[i+len(p):]
	}
	return strings.HasSuffix(got, last)
}

// matchResponse matches a curl -i response: the status line, each header
// field shown (in any order among those not shown), then the body.
func matchResponse(want, got []string) error {
	wantHead, wantBody := splitHead(want)
	gotHead, gotBody := splitHead(got)
	if len(gotHead) == 0 || !matchLine(wantHead[0], gotHead[0]) {
		first := ""
		if len(gotHead) > 0 {
			first = gotHead[0]
		}
		return fmt.Errorf("status line %q, want %q", first, wantHead[0])
	}
	for _, w := range wantHead[1:] {
		name, _, _ := strings.Cut(w, ":")
		var same []string
		found := false
		for _, g := range gotHead[1:] {
			gname, _, _ := strings.Cut(g, ":")
			if !strings.EqualFold(name, gname) {
				continue
			}
			same = append(same, g)
			if matchLine(w, g) {
				found = true
				break
			}
		}
		if !found {
			if same == nil {
				return fmt.Errorf("no %s header field, want %q", name, w)
			}
			return fmt.Errorf("header field %q, want %q", strings.Join(same, `", "`), w)
		}
	}
	if err := matchLines(wantBody, gotBody); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	return nil
}

// splitHead splits a response at its first empty line.
func splitHead(ls []string) (head, body []string) {
	for i, l := range ls {
		if l == "" {
			return ls[:i], ls[i+1:]
		}
	}
	return ls, nil
}
