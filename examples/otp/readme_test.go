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
		Binaries: map[string]*servicetest.Binary{"go run ./examples/otp": &otpBinary},
		// On a test machine loaded by other tests a decision can take longer
		// than the default 100ms, and the service would fail closed: the
		// counts the README shows are those of a Redis that answers.
		Env: []string{"LIMITER_TIMEOUT=5s"},
	})
}
