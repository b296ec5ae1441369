package ceiling

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// TestEvictionsAreReported: when the memory store evicts keys holding spent
// units (a flood of fresh keys past its bound), the health report counts
// them and warns, and an observer can read the count.
func TestEvictionsAreReported(t *testing.T) {
	store := memory.New(memory.WithMaxKeys(64), memory.WithSweepInterval(0), memory.WithLogger(slog.New(&logRecorder{})))
	defer store.Close()
	obs := &configRecorder{}
	l := MustNew([]Rule{{Name: "otp", Limit: 3, Period: 15 * time.Minute}}, WithBackend(store), WithObserver(obs))
	defer l.Close()
	if h := l.Health(); h.EvictedKeys != 0 || len(h.Warnings) != 0 {
		t.Fatalf("before the flood: %+v", h)
	}
	for i := range 1000 {
		if _, err := l.Decide(context.Background(), Input{Rule: "otp", Key: fmt.Sprint("+4475", i)}); err != nil {
			t.Fatal(err)
		}
	}
	h := l.Health()
	if h.EvictedKeys == 0 || h.EvictedKeys != store.Evictions() {
		t.Errorf("EvictedKeys = %d, want the store's %d (> 0)", h.EvictedKeys, store.Evictions())
	}
	if len(h.Warnings) != 1 || !strings.Contains(h.Warnings[0], fmt.Sprintf("evicted %d keys holding spent units", h.EvictedKeys)) {
		t.Errorf("warnings = %q", h.Warnings)
	}
	if len(obs.got) != 1 || obs.got[0].Health == nil || obs.got[0].Health().EvictedKeys != h.EvictedKeys {
		t.Errorf("the observer cannot read the evictions")
	}
}
