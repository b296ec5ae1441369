package ceiling

import (
	"log/slog"
	"slices"
	"testing"
	"time"
)

type configRecorder struct {
	NopObserver
	got []LimiterConfig
}

func (c *configRecorder) ObserveConfig(lc LimiterConfig) { c.got = append(c.got, lc) }

// A ConfigObserver learns the rules and the timeout a remote backend's
// calls are bounded by, once; an in-process backend has no timeout.
func TestConfigObserverIsToldTheRulesAndTheTimeout(t *testing.T) {
	rules := []Rule{
		{Name: "chat:minute", Key: RemoteAddr, Limit: 3, Period: time.Minute},
		{Name: "chat:day", Key: RemoteAddr, Limit: 100, Period: 24 * time.Hour},
	}
	remote := newCounting()
	remote.remote = true
	for _, tc := range []struct {
		name    string
		opts    []Option
		timeout time.Duration
	}{
		{"remote", []Option{WithBackend(remote), WithTimeout(250 * time.Millisecond)}, 250 * time.Millisecond},
		{"remote default", []Option{WithBackend(remote)}, DefaultTimeout},
		{"in process", []Option{WithBackend(newCounting()), WithTimeout(250 * time.Millisecond)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &configRecorder{}
			l := MustNew(rules, append(tc.opts, WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))...)
			defer l.Close()
			if len(obs.got) != 1 {
				t.Fatalf("ObserveConfig called %d times, want once", len(obs.got))
			}
			c := obs.got[0]
			if want := []string{"chat:minute", "chat:day"}; !slices.Equal(c.Rules, want) {
				t.Errorf("rules = %q, want %q", c.Rules, want)
			}
			if c.Timeout != tc.timeout {
				t.Errorf("timeout = %v, want %v", c.Timeout, tc.timeout)
			}
		})
	}
}
