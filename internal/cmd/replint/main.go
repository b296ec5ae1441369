// Command replint checks the repository rather than the library: that no
// build output is tracked, that the root module neither requires nor
// builds a framework, that the docs name only what package ceiling
// exports and close the limiters their snippets build, and that the root
// package stays within its budget of exported names. .ci/run runs it from
// the repository's root; it prints each problem and exits 1 if any.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// maxRootNames is the root package's budget of exported top-level names
// (issue 25): a feature earns its names.
const maxRootNames = 110

var problems []string

func fail(format string, args ...any) {
	problems = append(problems, fmt.Sprintf(format, args...))
}

func main() {
	api, n := exportedNames()
	noBuildOutput()
	noFrameworkInCore()
	keysSummary(api)
	snippetsClose()
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "replint:", p)
		}
		os.Exit(1)
	}
	fmt.Printf("replint: ok (%d exported names in package ceiling, budget %d)\n", n, maxRootNames)
}

// frameworkPrefixes are the import paths that live only in nested modules
// (adapters/echo, adapters/gin, metrics/prometheus): a net/http user of the
// core never downloads them.
var frameworkPrefixes = []string{"github.com/labstack/echo", "github.com/gin-gonic/gin", "github.com/prometheus/"}

func isFramework(path string) bool {
	for _, f := range frameworkPrefixes {
		if strings.HasPrefix(path, f) {
			return true
		}
	}
	return false
}

// noFrameworkInCore: the root module, as a user who requires it sees it
// (no go.work), requires no framework, and neither the core, the backends
// nor their tests import one or an adapter.
func noFrameworkInCore() {
	goCmd := func(args ...string) []byte {
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "GOWORK=off")
		out, err := cmd.Output()
		if err != nil {
			fail("go %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	var mod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal(goCmd("mod", "edit", "-json"), &mod); err != nil {
		fail("go mod edit -json: %v", err)
	}
	for _, r := range mod.Require {
		if isFramework(r.Path) {
			fail("the root go.mod requires %s; only the nested modules may", r.Path)
		}
	}
	deps := strings.Fields(string(goCmd("list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...")))
	// The listing must be the real one, or an empty list would pass.
	for _, want := range []string{"github.com/ceiling-go/ceiling", "github.com/ceiling-go/ceiling/backend/memory", "github.com/ceiling-go/ceiling/backend/redis", "net/http"} {
		if !slices.Contains(deps, want) {
			fail("go list -deps of the root module lacks %s; got %d packages", want, len(deps))
			return
		}
	}
	for _, p := range deps {
		if isFramework(p) || strings.HasPrefix(p, "github.com/ceiling-go/ceiling/adapters/") {
			fail("the root module's build includes %s: frameworks and adapters belong in nested modules", p)
		}
	}
}

// noBuildOutput: the repository holds source, not build outputs (a 12.8 MB
// examples/chat/chat was once committed).
func noBuildOutput() {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil || len(out) == 0 {
		fail("git ls-files: %v (run replint in a checkout)", err)
		return
	}
	magic := map[string][]byte{
		"ELF executable":     []byte("\x7fELF"),
		"Mach-O executable":  {0xcf, 0xfa, 0xed, 0xfe},
		"Windows executable": []byte("MZ"),
		"Go archive":         []byte("!<arch>"),
	}
	for _, path := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		f, err := os.Open(path)
		if err != nil {
			continue // deleted in the working tree
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		fi, _ := f.Stat()
		f.Close()
		for kind, m := range magic {
			if bytes.HasPrefix(head[:n], m) {
				fail("%s is a tracked %s: git rm --cached it and ignore it in .gitignore", path, kind)
			}
		}
		if fi != nil && fi.Size() > 1<<20 {
			fail("%s is a tracked file of %d bytes: build outputs and data belong outside the repository", path, fi.Size())
		}
	}
	for _, bin := range []string{"examples/chat/chat", "examples/otp/otp", "examples/quickstart/quickstart"} {
		if exec.Command("git", "check-ignore", "-q", bin).Run() != nil {
			fail("%s is not ignored by .gitignore", bin)
		}
	}
}

var (
	// qualified is a ceiling.Name reference in Go code.
	qualified = regexp.MustCompile(`\bceiling\.([A-Z]\w*)`)
	// span is an inline code span that starts with an identifier:
	// `BodyTimeout`, `IPv6Prefix(56)`.
	span = regexp.MustCompile("`(?:ceiling\\.)?([A-Z]\\w*)[`(]")
	// builds is a limiter built in Go code: l := ceiling.MustNew(.
	builds = regexp.MustCompile(`(\w+)(?:, err)? :?= ceiling\.(?:Must)?New\(`)
)

// keysSummary: the README's "Choosing a key" names every ceiling API that
// docs/keys.md documents, and neither page names one that does not exist.
func keysSummary(api map[string]bool) {
	readme, page := read("README.md"), read("docs/keys.md")
	start := strings.Index(readme, "\n## Choosing a key\n")
	if start < 0 {
		fail(`README.md has no "## Choosing a key" section`)
		return
	}
	summary := readme[start+1:]
	if end := strings.Index(summary, "\n## "); end >= 0 {
		summary = summary[:end]
	}
	if !strings.Contains(summary, "(docs/keys.md)") {
		fail(`README's "Choosing a key" does not link docs/keys.md`)
	}
	inSummary := mentioned(summary, api)
	for _, name := range mentioned(page, api) {
		if !slices.Contains(inSummary, name) {
			fail("docs/keys.md documents ceiling.%s; README's \"Choosing a key\" never names it", name)
		}
	}
	for doc, text := range map[string]string{"README.md": summary, "docs/keys.md": page} {
		for _, m := range qualified.FindAllStringSubmatch(text, -1) {
			if !api[m[1]] {
				fail("%s names ceiling.%s, which package ceiling does not export", doc, m[1])
			}
		}
	}
}

// mentioned returns the exported names text refers to, sorted.
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

// snippetsClose: every Go snippet of the README and docs/ that builds a
// limiter closes it, since a reader copies snippets and a limiter holds a
// goroutine until Close.
func snippetsClose() {
	docs, _ := filepath.Glob("docs/*.md")
	checked := 0
	for _, path := range append([]string{"README.md"}, docs...) {
		blocks := strings.Split(read(path), "\n```")
		for i := 1; i < len(blocks); i += 2 {
			if !strings.HasPrefix(blocks[i], "go\n") {
				continue
			}
			for _, m := range builds.FindAllStringSubmatch(blocks[i], -1) {
				checked++
				if !strings.Contains(blocks[i], m[1]+".Close()") {
					fail("%s: a Go snippet builds the limiter %s but never calls %s.Close()", path, m[1], m[1])
				}
			}
		}
	}
	if checked < 2 {
		fail("found %d limiters built in the docs' snippets; the README alone builds two", checked)
	}
}

// exportedNames are package ceiling's top-level names, each marked
// exported or not; the exported ones must fit maxRootNames.
func exportedNames() (map[string]bool, int) {
	paths, _ := filepath.Glob("*.go")
	names := map[string]bool{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			fail("%v", err)
			continue
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = d.Name.IsExported()
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
	n := 0
	for _, exported := range names {
		if exported {
			n++
		}
	}
	if n < 50 {
		fail("found only %d exported names in package ceiling: run replint from the repository's root", n)
	}
	if n > maxRootNames {
		fail("package ceiling exports %d top-level names, over its budget of %d", n, maxRootNames)
	}
	return names, n
}

func read(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	return string(b)
}
