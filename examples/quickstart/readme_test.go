package main

import (
	"os"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/examples/internal/transcript"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) {
	code := redistest.Main(m)
	quickstart.Remove()
	os.Exit(code)
}

var quickstart = servicetest.Binary{Pkg: "github.com/ceiling-go/ceiling/examples/quickstart"}

// The README's first code is this program, byte for byte.
func TestREADMEFirstCodeIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	// The first fenced block of the README, whatever its language.
	_, rest, ok := strings.Cut(string(readme), "\n```")
	if !ok {
		t.Fatal("README.md has no code block")
	}
	info, rest, _ := strings.Cut(rest, "\n")
	code, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("README.md's first code block is not closed")
	}
	if info != "go" || code != string(program) {
		t.Errorf("README.md's first code block (%q) is not examples/quickstart/main.go:\n%s", info, code)
	}
}

// The README's session runs against this program (see package transcript
// for the format): "go run ." is the built binary.
func TestREADME(t *testing.T) {
	transcript.Test(t, "../../README.md", transcript.Config{
		Binaries: map[string]*servicetest.Binary{"go run .": &quickstart},
	})
}
