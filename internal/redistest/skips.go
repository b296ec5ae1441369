package redistest

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// skips counts the tests each missing program made skip, for [Main]'s
// report.
var skips struct {
	mu sync.Mutex
	n  map[string]int
}

func skipped(program string) {
	skips.mu.Lock()
	defer skips.mu.Unlock()
	if skips.n == nil {
		skips.n = map[string]int{}
	}
	skips.n[program]++
}

// skipReport is the line Main prints for package pkg, or "" when no test
// skipped: how many tests skipped, why, and how to run them.
func skipReport(pkg string) string {
	skips.mu.Lock()
	defer skips.mu.Unlock()
	total := 0
	var missing []string
	for program, n := range skips.n {
		total += n
		missing = append(missing, program)
	}
	if total == 0 {
		return ""
	}
	slices.Sort(missing)
	tests := "tests"
	if total == 1 {
		tests = "test"
	}
	return fmt.Sprintf("redistest: %s: %d Redis %s SKIPPED: %s not found on PATH "+
		"(install Redis 6.2 or newer to run them; %s=1 makes this a failure)\n",
		pkg, total, tests, strings.Join(missing, " and "), RequireEnv)
}

// reportSkips prints the skip report where a person running go test sees
// it. go test shows nothing but "ok" for a passing package unless -v, and
// keeps the test binary's own output to itself; so, when the binary runs
// under the go command, the line goes to the go command's standard error
// (see goCommandStderr), and to the binary's own otherwise (-v, or a test
// binary run by hand).
func reportSkips(pkg string) {
	line := skipReport(pkg)
	if line == "" {
		return
	}
	var w io.Writer = os.Stderr
	if !testing.Verbose() {
		if f := goCommandStderr(); f != nil {
			defer f.Close()
			w = f
		}
	}
	io.WriteString(w, line)
}

// goCommandStderr opens the standard error of the go command that runs this
// test binary, or returns nil when there is none or writing to it could
// garble it. It works on Linux, through /proc. A terminal or a pipe takes
// a line as written; a regular file only when the go command appends to it
// (`>>`): opened anew, the file has an offset of its own, and a line
// written at it would be overwritten by the go command's next one.
func goCommandStderr() *os.File {
	if runtime.GOOS != "linux" {
		return nil
	}
	proc := "/proc/" + strconv.Itoa(os.Getppid())
	if comm, err := os.ReadFile(proc + "/comm"); err != nil || strings.TrimSpace(string(comm)) != "go" {
		return nil
	}
	fi, err := os.Stat(proc + "/fd/2")
	if err != nil {
		return nil
	}
	if fi.Mode().IsRegular() && !appends(proc+"/fdinfo/2") {
		return nil
	}
	f, err := os.OpenFile(proc+"/fd/2", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}

// appends reports whether the file descriptor described by the fdinfo file
// at path was opened with O_APPEND.
func appends(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&uint64(os.O_APPEND) != 0
		}
	}
	return false
}

// testedPackage returns the import path of the package this test binary
// tests: go test names the binary's main module path after it.
func testedPackage() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Path != "" {
		return strings.TrimSuffix(bi.Path, ".test")
	}
	return "this package"
}
