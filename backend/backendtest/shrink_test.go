package backendtest_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/backendtest"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// forgetful is the memory store with a planted defect: its Reset forgets
// nothing. The defect takes exactly three operations to show, each of them
// needed: a charge on a key, a Reset of that key, and a decision on it
// that finds the charge still there (without the charge or the Reset
// there is nothing to forget, and a Reset answers nothing to compare).
type forgetful struct{ *memory.Store }

func (forgetful) Reset(context.Context, ...string) error { return nil }

// forgetfulDifferential is the differential test of forgetful; its Paste
// is this function's call, so a printed case replays against it.
func forgetfulDifferential(t testing.TB) backendtest.Differential {
	return backendtest.Differential{
		Paste: "forgetfulDifferential(t)",
		New: func(t testing.TB, now func() time.Time) backendtest.Target {
			return backendtest.Target{Backend: forgetful{memory.New(memory.WithClock(now), memory.WithSweepInterval(0))}}
		},
	}
}

// shrinkChildEnv makes TestForgetfulBackendDisagrees run: it is the
// process TestShrunkCaseIsMinimalAndPasteable starts, since Run fails its
// test and that failure's output is what is checked.
const shrinkChildEnv = "CEILING_BACKENDTEST_SHRINK_CHILD"

func TestForgetfulBackendDisagrees(t *testing.T) {
	if os.Getenv(shrinkChildEnv) == "" {
		t.Skip("run by TestShrunkCaseIsMinimalAndPasteable, in a process of its own")
	}
	d := forgetfulDifferential(t)
	build, replays := d.New, 0
	d.New = func(t testing.TB, now func() time.Time) backendtest.Target {
		replays++
		return build(t, now)
	}
	t.Cleanup(func() { t.Logf("%d replays", replays) })
	d.Run(t)
}

// TestShrunkCaseIsMinimalAndPasteable is issue 13's "a disagreement is
// shrunk to a minimal sequence and printed as a ready-to-paste test case",
// checked end to end: Differential.Run on a backend with a planted defect
// (forgetful) fails; the sequence it prints is the three operations the
// defect needs and nothing more, one request and one key each, on one key;
// and the printed function is Go that, pasted into this package's tests
// (a go test overlay adds it as a file), compiles and fails with the same
// disagreement.
func TestShrunkCaseIsMinimalAndPasteable(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to compile the printed case with")
	}
	child := exec.Command(os.Args[0], "-test.run=^TestForgetfulBackendDisagrees$", "-test.count=1")
	child.Env = append(os.Environ(), shrinkChildEnv+"=1")
	out, err := child.CombinedOutput()
	if _, failed := err.(*exec.ExitError); !failed || !strings.Contains(string(out), "the backend disagrees with the model") {
		t.Fatalf("Run on a backend whose Reset does nothing: %v, want a disagreement; output:\n%s", err, out)
	}
	report := string(out)

	m := regexp.MustCompile(`Shrunk from (\d+) to (\d+) steps in \d+ replays \([^)]*\), it fails with:\n\s*(.*)\n`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("no shrink summary in:\n%s", report)
	}
	from, _ := strconv.Atoi(m[1])
	to, _ := strconv.Atoi(m[2])
	failure := strings.TrimSpace(m[3])
	if to != 3 || from <= to {
		t.Errorf("shrunk from %d to %d steps, want a longer sequence shrunk to 3 (charge, Reset, decide)", from, to)
	}

	// Each simplification moves one way, so shrinking ends by itself: a
	// few dozen replays here. One that went back and forth between two
	// failing sequences would replay until its two-minute deadline.
	if r := regexp.MustCompile(`(\d+) replays`).FindStringSubmatch(report); r == nil {
		t.Errorf("no replay count in:\n%s", report)
	} else if n, _ := strconv.Atoi(r[1]); n > 1000 {
		t.Errorf("%d replays to find and shrink the disagreement, want a few dozen: shrinking must converge", n)
	}

	code := pastedFunc(t, report)
	steps := replayedSteps(t, code)
	if len(steps) != 3 {
		t.Fatalf("the printed case has %d steps, want 3:\n%s", len(steps), code)
	}
	resetKeys := stringsOf(fieldOf(steps[1], "Reset"))
	if len(resetKeys) != 1 || fieldOf(steps[1], "Decide") != nil {
		t.Fatalf("the second step is not a Reset of one key:\n%s", code)
	}
	for _, i := range []int{0, 2} {
		reqs, ok := fieldOf(steps[i], "Decide").(*ast.CompositeLit)
		if !ok || len(reqs.Elts) != 1 {
			t.Fatalf("step %d is not a Decide of one request:\n%s", i, code)
		}
		if key := stringsOf(fieldOf(reqs.Elts[0].(*ast.CompositeLit), "Key")); len(key) != 1 || key[0] != resetKeys[0] {
			t.Errorf("step %d decides key %v, want the Reset's %q:\n%s", i, key, resetKeys[0], code)
		}
	}
	if !strings.HasPrefix(failure, "step 2 ") {
		t.Errorf("the shrunk sequence fails with %q, want at its third step", failure)
	}

	// Paste it: a file of this package's tests, added by an overlay.
	dir := t.TempDir()
	pasted := filepath.Join(dir, "regression_test.go")
	src := "package backendtest_test\n\nimport (\n\t\"testing\"\n\t\"time\"\n\n" +
		"\t\"github.com/ceiling-go/ceiling/backend\"\n\t\"github.com/ceiling-go/ceiling/backend/backendtest\"\n)\n\n" +
		"var _ time.Duration // the pasted steps may name no duration\n\n" + code
	if err := os.WriteFile(pasted, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(here, "zz_pasted_regression_test.go"): pasted}})
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	run := exec.Command(goCmd, "test", "-overlay="+overlayFile, "-count=1", "-run=^TestModelRegression$", ".")
	out, err = run.CombinedOutput()
	if _, failed := err.(*exec.ExitError); !failed || !strings.Contains(string(out), failure) || !strings.Contains(string(out), "--- FAIL: TestModelRegression") {
		t.Fatalf("the pasted case: %v, want TestModelRegression to fail with %q; output:\n%s\nsource:\n%s", err, failure, out, src)
	}
}

// pastedFunc cuts the printed test function out of a failure report,
// without the indentation go test's output adds.
func pastedFunc(t *testing.T, report string) string {
	t.Helper()
	_, after, ok := strings.Cut(report, "Paste it as a regression test:\n")
	if !ok {
		t.Fatalf("no test printed in:\n%s", report)
	}
	var lines []string
	indent := ""
	for _, line := range strings.Split(after, "\n") {
		if indent == "" {
			if i := strings.Index(line, "func TestModelRegression("); i >= 0 {
				indent = line[:i]
			} else {
				continue
			}
		}
		lines = append(lines, strings.TrimPrefix(line, indent))
		if strings.TrimSpace(line) == "}" && !strings.HasPrefix(strings.TrimPrefix(line, indent), "\t") {
			return strings.Join(lines, "\n") + "\n"
		}
	}
	t.Fatalf("no complete test function in:\n%s", report)
	return ""
}

// replayedSteps parses code, which must be valid Go, and returns the
// elements of the Step slice it hands forgetfulDifferential(t).Replay.
func replayedSteps(t *testing.T, code string) []*ast.CompositeLit {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "pasted.go", "package p\n\n"+code, 0)
	if err != nil {
		t.Fatalf("the printed case is not Go: %v\n%s", err, code)
	}
	var steps []*ast.CompositeLit
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Replay" || len(call.Args) != 2 {
			return true
		}
		if recv, ok := sel.X.(*ast.CallExpr); !ok || !isIdent(recv.Fun, "forgetfulDifferential") {
			return true
		}
		lit, ok := call.Args[1].(*ast.CompositeLit)
		if !ok {
			return true
		}
		for _, e := range lit.Elts {
			if s, ok := e.(*ast.CompositeLit); ok {
				steps = append(steps, s)
			}
		}
		return false
	})
	if steps == nil {
		t.Fatalf("the printed case calls no forgetfulDifferential(t).Replay with a step list:\n%s", code)
	}
	return steps
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// fieldOf is the value of a keyed field of a composite literal, or nil.
func fieldOf(lit *ast.CompositeLit, name string) ast.Expr {
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok && isIdent(kv.Key, name) {
			return kv.Value
		}
	}
	return nil
}

// stringsOf returns the string literals of e: a literal, or a slice of
// them.
func stringsOf(e ast.Expr) []string {
	var out []string
	ast.Inspect(e, func(n ast.Node) bool {
		if b, ok := n.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil {
				out = append(out, s)
			}
		}
		return true
	})
	return out
}
