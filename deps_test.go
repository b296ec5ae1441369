package ceiling_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// frameworkPrefixes are the import paths that live only in nested modules
// (adapters/echo, adapters/gin, metrics/prometheus): a net/http user of the
// core never downloads them.
var frameworkPrefixes = []string{
	"github.com/labstack/echo",
	"github.com/gin-gonic/gin",
	"github.com/prometheus/",
}

// frameworks returns the paths that belong to a framework.
func frameworks(paths []string) []string {
	var bad []string
	for _, p := range paths {
		for _, f := range frameworkPrefixes {
			if strings.HasPrefix(p, f) {
				bad = append(bad, p)
				break
			}
		}
	}
	return bad
}

// goCmd runs the go command on the root module alone, as a user who
// requires github.com/ceiling-go/ceiling sees it (no go.work).
func goCmd(t *testing.T, args ...string) []byte {
	t.Helper()
	gobin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("no go command: %v", err)
	}
	cmd := exec.Command(gobin, args...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return out
}

func TestCoreAndBackendsImportNoFramework(t *testing.T) {
	out := goCmd(t, "list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...")
	deps := strings.Fields(string(out))
	// The listing must be the real one, or an empty list would pass.
	for _, want := range []string{"github.com/ceiling-go/ceiling", "github.com/ceiling-go/ceiling/backend/memory", "github.com/ceiling-go/ceiling/backend/redis", "net/http"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps of the root module lacks %s; got %d packages", want, len(deps))
		}
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/ceiling-go/ceiling/adapters/") {
			t.Errorf("the root module's build includes the adapter %s: it must stay a nested module", p)
		}
	}
	if bad := frameworks(deps); len(bad) > 0 {
		t.Errorf("the core, the backends or their tests import %v; frameworks belong under adapters/ and metrics/", bad)
	}
}

func TestRootGoModRequiresNoFramework(t *testing.T) {
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(goCmd(t, "mod", "edit", "-json"), &mod); err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	if got, want := mod.Module.Path, "github.com/ceiling-go/ceiling"; got != want {
		t.Fatalf("module %q, want %q", got, want)
	}
	var paths []string
	for _, r := range mod.Require {
		paths = append(paths, r.Path)
	}
	if bad := frameworks(paths); len(bad) > 0 {
		t.Errorf("the root go.mod requires %v; only the nested modules may", bad)
	}
}

func TestFrameworksAreRecognised(t *testing.T) {
	got := frameworks([]string{"net/http", "github.com/gin-gonic/gin/render", "github.com/labstack/echo/v4",
		"github.com/prometheus/client_golang/prometheus", "github.com/redis/go-redis/v9"})
	if want := []string{"github.com/gin-gonic/gin/render", "github.com/labstack/echo/v4", "github.com/prometheus/client_golang/prometheus"}; !slices.Equal(got, want) {
		t.Errorf("frameworks = %v, want %v", got, want)
	}
}
