package citest

import "testing"

// Only runs a test exactly when the ceilingci tag is set: under the tag the
// body must be reached, without it never.
func TestOnlyFollowsTheTag(t *testing.T) {
	ran := false
	t.Run("gated", func(t *testing.T) {
		Only(t)
		ran = true
	})
	if ran != enabled {
		t.Errorf("the gated test ran = %v with the ceilingci tag = %v", ran, enabled)
	}
}
