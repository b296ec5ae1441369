package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The complete program metrics/otel's README opens with compiles against
// the working tree (this module has the OTLP exporters and otelhttp it
// imports; metrics/otel itself depends on the OpenTelemetry API only).
func TestOTelREADMEProgramBuilds(t *testing.T) {
	b, err := os.ReadFile("../../metrics/otel/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(string(b), "## A complete program\n\n```go\n")
	program, _, closed := strings.Cut(rest, "```")
	if !found || !closed || !strings.Contains(program, "func main()") {
		t.Fatal("metrics/otel/README.md has no complete program under its heading")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(program), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "prog"), src).CombinedOutput(); err != nil {
		t.Fatalf("the README's program does not build: %v\n%s", err, out)
	}
}
