// Package citest marks the tests that only CI runs: validation a user does
// not need in order to trust the library, and that needs a machine to
// itself (a CPU flood that must not be mistaken for a backend failure).
// The README's test command leaves them out; .ci/run builds with the
// ceilingci tag, which runs them:
//
//	go test -tags ceilingci $(go list -m -f '{{.Dir}}/...')
package citest

import "testing"

// Only skips t, saying why, unless the tests were built with the ceilingci
// tag.
func Only(t testing.TB) {
	t.Helper()
	if !enabled {
		t.Skip("a CI-only test (it floods the CPU, or times a frozen server and needs a CPU to itself): run it with go test -tags ceilingci, as .ci/run does")
	}
}

// Enabled reports whether the tests were built with the ceilingci tag: a
// CI run, which may also reach the network (the module proxy).
func Enabled() bool { return enabled }
