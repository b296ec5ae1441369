package main

import (
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/examples/internal/transcript"
)

// The README's session is what the service answers (see package
// transcript for the format).
func TestREADME(t *testing.T) {
	transcript.Test(t, "README.md", transcript.Config{
		Binaries: map[string]*servicetest.Binary{"go run ./examples/chat": &chatBinary},
	})
}
