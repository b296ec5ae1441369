package ceiling_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// builds finds a limiter being built in Go code: limiter := ceiling.MustNew(
// or l, err := ceiling.New(.
var builds = regexp.MustCompile(`(\w+)(?:, err)? :?= ceiling\.(?:Must)?New\(`)

// Every Go snippet of the README and docs/ that builds a limiter closes it:
// a limiter holds a goroutine until Close, and a reader copies snippets
// (issue 26: the README never mentioned Close, and 1000 limiters built
// from it left 1000 goroutines running).
func TestDocSnippetsCloseTheirLimiters(t *testing.T) {
	docs, _ := filepath.Glob("docs/*.md")
	checked := 0
	for _, path := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks := strings.Split(string(text), "\n```")
		for i := 1; i < len(blocks); i += 2 {
			block := blocks[i]
			if !strings.HasPrefix(block, "go\n") {
				continue
			}
			for _, m := range builds.FindAllStringSubmatch(block, -1) {
				checked++
				if !strings.Contains(block, m[1]+".Close()") {
					t.Errorf("%s: a Go snippet builds the limiter %s but never calls %s.Close():\n%s", path, m[1], m[1], block)
				}
			}
		}
	}
	if checked < 2 {
		t.Fatalf("found %d limiters built in the docs' snippets; the README alone builds two", checked)
	}
}
