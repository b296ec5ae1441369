package ceiling

import (
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

type configRecorder struct {
	NopObserver
	got []observedConfig
}

// observedConfig is what one ObserveConfig call was told.
type observedConfig struct {
	Rules   []string
	Timeout time.Duration
	Health  func() Health
}

func (c *configRecorder) ObserveConfig(rules []string, timeout time.Duration, health func() Health) {
	c.got = append(c.got, observedConfig{rules, timeout, health})
}

// An observer learns the rules and the timeout a remote backend's
// calls are bounded by, once; an in-process backend has no timeout.
func TestObserverIsToldTheRulesAndTheTimeout(t *testing.T) {
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
		{"remote default", []Option{WithBackend(remote)}, defaultTimeout},
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

type callCounter struct {
	NopObserver
	mu            sync.Mutex
	calls, cached int
}

func (c *callCounter) ObserveBackend(time.Duration, error) { c.mu.Lock(); c.calls++; c.mu.Unlock() }

type cacheCounter struct{ *callCounter }

func (c cacheCounter) ObserveCached() { c.mu.Lock(); c.cached++; c.mu.Unlock() }

// An answer from the deny cache is not a backend call: its latency would
// hide a slow backend's quantiles. It is counted apart, for an observer
// that counts it.
func TestCachedAnswersAreNotBackendCalls(t *testing.T) {
	rules := []Rule{{Name: "ip", Key: RemoteAddr, Limit: 100, Period: time.Minute}}
	for _, asks := range []bool{true, false} {
		be := &denyCached{spent: "no key starts so"}
		counts := &callCounter{}
		var obs Observer = counts
		if asks {
			obs = cacheCounter{counts}
		}
		l := MustNew(rules, WithBackend(be), WithObserver(obs), WithLogger(slog.New(slog.DiscardHandler)))
		h := l.Handler(okHandler)
		if got, want := codes(t, h, 3), []int{200, 200, 200}; !sameInts(got, want) {
			t.Fatalf("statuses = %v, want %v", got, want)
		}
		be.mu.Lock()
		be.spent = "" // every key is in the deny cache
		be.mu.Unlock()
		if got, want := codes(t, h, 2), []int{429, 429}; !sameInts(got, want) {
			t.Fatalf("statuses = %v, want %v", got, want)
		}
		l.Close()
		counts.mu.Lock()
		calls, cached := counts.calls, counts.cached
		counts.mu.Unlock()
		if calls != 3 {
			t.Errorf("observer counting cached answers %v: backend calls observed = %d, want 3", asks, calls)
		}
		if want := map[bool]int{true: 2, false: 0}[asks]; cached != want {
			t.Errorf("observer counting cached answers %v: cached answers observed = %d, want %d", asks, cached, want)
		}
	}
}
