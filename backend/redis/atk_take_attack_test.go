package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// TestACallTakenAsItGivesUpIsNotToldNotSent_Regression: a caller whose
// deadline passes while a round trip takes its queued op gives up (gone)
// and asks whether a round trip took it (taken) at the moment take has
// seen it not gone but not yet claimed it. It was told ErrNotSent, which
// promises the call took no effect (the limiter sheds the request, and
// resends a settlement without a Once), while take went on to send it.
func TestACallTakenAsItGivesUpIsNotToldNotSent_Regression(t *testing.T) {
	s := &Store{}
	b := newPipeliner(s, "")
	w, ops := newWaiter(context.Background(), 1)
	ops[0] = op{script: batchScript, key: "k", lone: loneCall{req: backend.Request{Key: "k"}}}
	w.budget = time.Millisecond
	w.n = 1
	w.pending.Store(1)
	w.unclaimed.Store(1)
	ops[0].w = w
	b.queue = append(b.queue, &ops[0])
	var told error
	duringTake = func(w *waiter) {
		w.giveUp()
		told = s.timeoutError(w, time.Now())
	}
	defer func() { duringTake = nil }()
	b.mu.Lock()
	batch := b.take(nil)
	b.mu.Unlock()
	sent := len(batch) == 1
	if told == nil {
		t.Fatal("the caller giving up during take was told nothing")
	}
	if sent && errors.Is(told, backend.ErrNotSent) {
		t.Errorf("take sent the op of a caller told %v", told)
	}
	if !sent && !errors.Is(told, backend.ErrNotSent) && !errors.Is(told, errWritten) {
		t.Errorf("an op not sent was told %v", told)
	}
}
