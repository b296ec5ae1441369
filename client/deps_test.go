package client

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The package is for any Go client, so it must cost its users nothing but
// the standard library: not even the rest of ceiling.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if got := strings.Fields(string(out)); len(got) != 1 || got[0] != "github.com/ceiling-go/ceiling/client" {
		t.Errorf("package client depends on %v besides the standard library", got)
	}
}
