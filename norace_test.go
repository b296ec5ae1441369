//go:build !race

package ceiling

// raceEnabled is true under -race, whose instrumentation (and sync.Pool's
// random drops) make allocation counts meaningless.
const raceEnabled = false
