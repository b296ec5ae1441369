package ceiling_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The repository holds source, not build outputs: a compiled example (a
// 12.8 MB examples/chat/chat was once committed) is ignored, never tracked.
func TestNoBuildOutputIsTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil || len(out) == 0 {
		t.Skipf("not a git checkout (git ls-files: %v)", err)
	}
	magic := map[string][]byte{
		"ELF executable":     []byte("\x7fELF"),
		"Mach-O executable":  {0xcf, 0xfa, 0xed, 0xfe},
		"Windows executable": []byte("MZ"),
		"Go test binary":     []byte("!<arch>"),
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
				t.Errorf("%s is a tracked %s: git rm --cached it and ignore it in .gitignore", path, kind)
			}
		}
		if fi != nil && fi.Size() > 1<<20 {
			t.Errorf("%s is a tracked file of %d bytes: build outputs and data belong outside the repository", path, fi.Size())
		}
	}
	// Each example's binary, as `go build` in its directory leaves it, is ignored.
	for _, bin := range []string{"examples/chat/chat", "examples/otp/otp", "examples/quickstart/quickstart"} {
		if err := exec.Command("git", "check-ignore", "-q", bin).Run(); err != nil {
			t.Errorf("%s is not ignored by .gitignore", bin)
		}
	}
}
