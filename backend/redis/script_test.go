package redis

import (
	"strings"
	"testing"
)

// TestScriptsIncludeTheLibrary pins where lib.lua goes: in place of each
// script's line "-- lib.lua", once, after the lines that set uses (the
// library defines only the functions of the algorithms in uses).
func TestScriptsIncludeTheLibrary(t *testing.T) {
	for name, src := range map[string]string{"batch.lua": batchSource, "decide.lua": decideSource} {
		head, _, ok := strings.Cut(src, "\n-- lib.lua\n")
		if !ok || !strings.Contains(head, "local uses = {}") {
			t.Errorf("%s: no line \"-- lib.lua\" after the lines that set uses", name)
		}
		if got := withLib(src); strings.Count(got, libSource) != 1 || strings.Contains(got, "\n-- lib.lua\n") {
			t.Errorf("%s: the library is not in place of its line \"-- lib.lua\", once", name)
		}
	}
}
