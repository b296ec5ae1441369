package ceiling

import (
	"log/slog"
	"net/http"
	"testing"
	"time"
)

// SetLimit changes the limit of a rule with an Estimate. It refused
// every such rule with "set Cost or Estimate, not both": New had
// defaulted the stored rule's Cost to 1, and SetLimit validated that copy.
func TestSetLimitOfAnEstimateRule_Regression(t *testing.T) {
	l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-Key"), Limit: 100, Period: time.Minute,
		Estimate: func(r *http.Request) (int64, error) { return 1, nil },
	}}, WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	if err := l.SetLimit("tokens", 50, 0); err != nil {
		t.Fatalf("SetLimit: %v", err)
	}
	if got := l.Health().Rules[0].Limit; got != 50 {
		t.Errorf("Health limit %d, want 50", got)
	}
	if err := l.SetLimit("tokens", 0, 0); err == nil {
		t.Error("SetLimit to 0 succeeded")
	}
}
