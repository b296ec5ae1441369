package ceiling_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's "Choosing a key" summarises docs/keys.md: every ceiling API
// the page documents (an option, a key function, a limit) is at least
// named in the summary, so that a reader of the README learns that it
// exists, and every ceiling.Name either page writes exists. A new option
// documented only on one page fails here.
func TestREADMEKeysSummaryNamesWhatDocsKeysDocuments(t *testing.T) {
	api := exportedNames(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("docs/keys.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(readme), "\n## Choosing a key\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Choosing a key" section`)
	}
	summary := string(readme[start+1:])
	if end := strings.Index(summary, "\n## "); end >= 0 {
		summary = summary[:end]
	}
	if !strings.Contains(summary, "(docs/keys.md)") {
		t.Error(`README's "Choosing a key" does not link docs/keys.md`)
	}
	inSummary := mentioned(summary, api)
	for _, name := range mentioned(string(page), api) {
		if !slices.Contains(inSummary, name) {
			t.Errorf("docs/keys.md documents ceiling.%s; README's \"Choosing a key\" never names it", name)
		}
	}
	for doc, text := range map[string]string{"README.md": summary, "docs/keys.md": string(page)} {
		for _, m := range qualified.FindAllStringSubmatch(text, -1) {
			if !api[m[1]] {
				t.Errorf("%s names ceiling.%s, which package ceiling does not export", doc, m[1])
			}
		}
	}
}

var (
	// qualified is a ceiling.Name reference in Go code.
	qualified = regexp.MustCompile(`\bceiling\.([A-Z]\w*)`)
	// span is an inline code span that starts with an identifier:
	// `BodyTimeout`, `IPv6Prefix(56)`, `TrustXForwardedForHops(n)`.
	span = regexp.MustCompile("`(?:ceiling\\.)?([A-Z]\\w*)[`(]")
)

// mentioned returns the exported ceiling names text refers to, in code or
// in code spans, sorted.
func mentioned(text string, api map[string]bool) []string {
	var names []string
	for _, re := range []*regexp.Regexp{qualified, span} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			if api[m[1]] && !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
	}
	slices.Sort(names)
	return names
}

// exportedNames are the package-level names package ceiling exports.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = s.Name.IsExported()
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = n.IsExported()
						}
					}
				}
			}
		}
	}
	if len(names) < 50 {
		t.Fatalf("found only %d names in package ceiling", len(names))
	}
	return names
}
