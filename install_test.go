package ceiling_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/internal/citest"
)

// The README's install recipe, for the time before the modules are
// published: a fresh module outside the repository requires a module at
// v0.0.0 with a replace to a clone, and go mod tidy resolves the rest. It is
// run here as written, with this checkout as the clone, for the core (the
// README's first program) and each adapter (a program that uses it; the
// adapters cost a build of their frameworks, so only CI runs them).
//
// By default it works offline, from the module cache the workspace already
// filled (GOPROXY=off): when the cache lacks a module the fresh build needs,
// it skips and says which. Under CI (the ceilingci tag) it may download.
func TestInstallRecipeBuildsAFreshModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module from scratch")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	clone, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	quickstart, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The recipe this test runs is the README's, with ../ceiling the clone.
	for _, line := range []string{
		"go mod edit -require=github.com/ceiling-go/ceiling@v0.0.0 -replace=github.com/ceiling-go/ceiling=../ceiling\ngo mod tidy\n",
		"go mod edit -require=github.com/ceiling-go/ceiling/adapters/echo@v0.0.0 \\\n\t-replace=github.com/ceiling-go/ceiling/adapters/echo=../ceiling/adapters/echo\ngo mod tidy\n",
	} {
		if !strings.Contains(string(readme), line) {
			t.Errorf("README.md no longer gives the recipe this test runs:\n%s", line)
		}
	}
	for _, tc := range []struct {
		name    string
		modules []string // the nested modules it requires besides the core
		program string
	}{
		{"core", nil, string(quickstart)},
		{"echo", []string{"adapters/echo"}, `package main

import (
	"github.com/ceiling-go/ceiling"
	ceilingecho "github.com/ceiling-go/ceiling/adapters/echo"
	"github.com/labstack/echo/v4"
)

func main() {
	limiter := ceiling.MustNew([]ceiling.Rule{{Name: "hello", Key: ceiling.Route, Limit: 3, Period: 60e9}})
	defer limiter.Close()
	e := echo.New()
	e.GET("/hello", func(c echo.Context) error { return c.String(200, "hello") }, ceilingecho.Middleware(limiter))
}
`},
		{"gin", []string{"adapters/gin"}, `package main

import (
	"github.com/ceiling-go/ceiling"
	ceilinggin "github.com/ceiling-go/ceiling/adapters/gin"
	"github.com/gin-gonic/gin"
)

func main() {
	limiter := ceiling.MustNew([]ceiling.Rule{{Name: "hello", Key: ceiling.Route, Limit: 3, Period: 60e9}})
	defer limiter.Close()
	router := gin.New()
	router.GET("/hello", ceilinggin.Middleware(limiter), func(c *gin.Context) { c.String(200, "hello") })
}
`},
		{"grpc", []string{"adapters/grpc"}, `package main

import (
	"fmt"

	ceilinggrpc "github.com/ceiling-go/ceiling/adapters/grpc"
)

func main() { fmt.Println(ceilinggrpc.FullMethod != nil) }
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.modules != nil {
				citest.Only(t)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(tc.program), 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(args ...string) {
				t.Helper()
				cmd := exec.Command(gobin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
				if !citest.Enabled() {
					// Offline: what the workspace's module cache holds.
					cmd.Env = append(cmd.Env, "GOPROXY=off", "GOSUMDB=off")
				}
				out, err := cmd.CombinedOutput()
				if err == nil {
					return
				}
				if s := string(out); strings.Contains(s, "module lookup disabled") || strings.Contains(s, "GOPROXY=off") {
					t.Skipf("the module cache lacks a module the fresh build needs (run once with the network):\n%s", s)
				}
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			// The README's recipe, with this checkout as the clone.
			run("mod", "init", "example.com/hello")
			edit := []string{"mod", "edit", "-require=github.com/ceiling-go/ceiling@v0.0.0", "-replace=github.com/ceiling-go/ceiling=" + clone}
			for _, m := range tc.modules {
				path := "github.com/ceiling-go/ceiling/" + m
				edit = append(edit, "-require="+path+"@v0.0.0", "-replace="+path+"="+filepath.Join(clone, m))
			}
			run(edit...)
			run("mod", "tidy")
			run("build", "-o", os.DevNull, ".")
		})
	}
}
