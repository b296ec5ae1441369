package ceiling

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// WithInstances declares how many instances of the service run. With an
// in-process backend and n > 1 each enforces the full limit, so the limiter
// warns (log and health report). With a shared backend it sizes
// [FailLocal]'s share to 1/n of each limit, never below a rule's cost, so
// that n instances deciding locally admit about one limit's worth.
func WithInstances(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("ceiling: WithInstances(%d): must be at least 1", n)
		}
		c.instances, c.instancesSet = n, true
		return nil
	}
}

// platforms are environment variables that platforms which run several
// instances of a service set, each with the platform's name.
var platforms = []struct{ env, name string }{
	{"K_SERVICE", "Cloud Run or Knative"},
	{"AWS_LAMBDA_FUNCTION_NAME", "AWS Lambda"},
	{"VERCEL", "Vercel"},
	{"KUBERNETES_SERVICE_HOST", "Kubernetes"},
}

// platformWarned makes the per-process limits warning a log line once per
// process, however many limiters raise it.
var platformWarned atomic.Bool

// warnPlatform warns, for an in-process backend without [WithInstances],
// that the environment names a platform running several instances.
func (l *Limiter) warnPlatform() {
	if l.remote || l.cfg.instancesSet {
		return
	}
	for _, p := range platforms {
		if os.Getenv(p.env) == "" {
			continue
		}
		note := fmt.Sprintf("limits are per process (in-process backend), and %s is set: on %s several instances may run, each enforcing the full limit; "+
			"share a backend (package backend/redis), or declare the count with ceiling.WithInstances(n), 1 if this is the only instance", p.env, p.name)
		if platformWarned.CompareAndSwap(false, true) {
			l.notes.warn(l.cfg.logger, note)
		} else {
			l.notes.add(note)
		}
		return
	}
}

// notes are warnings about a configuration, each kept once, for
// [Limiter.Health].
type notes struct {
	mu     sync.Mutex
	list   []string
	logged int // list[:logged] were logged, for notes logged later (flush)
}

// warn logs note once and keeps it.
func (n *notes) warn(logger *slog.Logger, note string) {
	if n.add(note) {
		logger.Warn("ceiling: " + note)
	}
}

// add keeps note, reporting whether it is new.
func (n *notes) add(note string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Contains(n.list, note) {
		return false
	}
	n.list = append(n.list, note)
	return true
}

// later keeps note and logs it once a limiter has set the process's
// logger (key functions are built before any limiter may exist).
func (n *notes) later(note string) {
	if n.add(note) && processLogger.Load() != nil {
		n.flush()
	}
}

// flush logs, with the process's logger, the notes not logged yet.
func (n *notes) flush() {
	n.mu.Lock()
	fresh := n.list[n.logged:]
	n.logged = len(n.list)
	n.mu.Unlock()
	logger := processLogger.Load()
	if logger == nil {
		logger = slog.Default()
	}
	for _, note := range fresh {
		logger.Warn("ceiling: " + note + " (Logged once per process.)")
	}
}

func (n *notes) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.list)
}

// Health is the limiter's state as [Limiter.HealthHandler] reports it.
type Health struct {
	// Status is "healthy" (the backend decides), "degraded" (the circuit
	// breaker is open and the rules' fail modes decide) or "closed" (after
	// [Limiter.Close]: the report is the one taken at Close, Since and
	// Reason still set if the limiter was degraded then). An observer
	// drops a closed limiter's health function, which no longer holds it.
	Status string `json:"status"`
	// Reason is, when degraded, the kind of the latest backend failure
	// ([KindOf]), never its text; the log has the whole error.
	Reason FailureKind `json:"reason,omitempty"`
	// Since is when the limiter became degraded.
	Since time.Time `json:"since,omitzero"`
	// NextProbeSeconds is, when degraded, how long until the background
	// probe asks the backend again (zero while a probe is in flight).
	NextProbeSeconds float64 `json:"next_probe_seconds,omitempty"`
	// Backend is "remote" or "in-process".
	Backend string `json:"backend"`
	// FailMode is the limiter's fail mode (rules may override it).
	FailMode string `json:"fail_mode"`
	// Warnings are configurations weaker than they read; they do not make
	// the limiter degraded.
	Warnings []string `json:"warnings,omitempty"`
	// DegradedTotal counts healthy → degraded transitions since start.
	DegradedTotal int64 `json:"degraded_total"`
	// EvictedKeys counts keys the in-process stores evicted while they held
	// spent units, to stay under their key bound: each gave quota back.
	EvictedKeys uint64 `json:"evicted_keys,omitempty"`
	// DroppedWrites counts settlements and slot releases that failed and
	// were never applied by the background resend either (one that may
	// have been applied, is older than its rule's Period, or is pending at
	// Close): a refund or release given up left unused units counted, an
	// error towards the limit; a forced charge given up left what the
	// request used past its estimate uncounted (at most the rule's
	// capacity), an error past it.
	DroppedWrites int64 `json:"dropped_writes,omitempty"`
	// Shed counts requests refused with 503 because this process was too
	// busy to send their backend call or read its reply in time, or a
	// FailOpen rule's call timed out before a probe confirmed the backend
	// at fault: it sheds load rather than admit unmetered.
	Shed int64 `json:"shed,omitempty"`
	// Rules reports what each rule admitted without the backend.
	Rules []RuleHealth `json:"rules"`
}

// RuleHealth is one rule's part of [Health]; counts run since start.
type RuleHealth struct {
	Name     string `json:"name"`
	FailMode string `json:"fail_mode"`
	Shadow   bool   `json:"shadow,omitempty"`
	// Limit and Burst are the rule's limit in force: its own, or the
	// latest [Limiter.SetLimit].
	Limit int64 `json:"limit"`
	Burst int64 `json:"burst,omitempty"`
	// FailOpenAdmissions counts requests admitted without enforcement.
	FailOpenAdmissions int64 `json:"fail_open_admissions"`
	// FailLocalAdmissions counts requests admitted by the in-process store.
	FailLocalAdmissions int64 `json:"fail_local_admissions"`
	// ShadowRejections counts requests a shadow rule would have rejected.
	ShadowRejections int64 `json:"shadow_rejections,omitempty"`
	// SlotsInUse is, for a [Concurrency] rule, how many slots the requests
	// this process admitted hold now (other instances' are not in it).
	SlotsInUse int64 `json:"slots_in_use,omitempty"`
}

// Health returns the limiter's current state. It makes no backend call: it
// reports what requests and the background probe saw, and the probe runs
// while degraded, so the report recovers without traffic.
func (l *Limiter) Health() Health {
	if h := l.reports().final.Load(); h != nil {
		return h.clone()
	}
	h := Health{
		Status:   "healthy",
		Backend:  "in-process",
		FailMode: l.cfg.failMode.String(),
		Rules:    make([]RuleHealth, len(l.rules)),
	}
	h.Warnings = l.engineWarnings()
	h.Warnings = append(h.Warnings, l.keyWarnings()...)
	h.Warnings = append(h.Warnings, spoofable.all()...)
	h.Warnings = append(h.Warnings, l.notes.all()...)
	if h.EvictedKeys = l.evictions(); h.EvictedKeys > 0 {
		h.Warnings = append(h.Warnings, fmt.Sprintf("the in-process store evicted %d keys holding spent units to stay under its key bound: their callers got quota back", h.EvictedKeys))
	}
	for i := range l.rules {
		r, pl := &l.rules[i], l.plans[i].Load()
		h.Rules[i] = RuleHealth{Limit: pl.limit, Burst: pl.burst, Name: r.Name, FailMode: l.modeOf(r).String(), Shadow: r.Shadow}
	}
	l.reportEngine(&h)
	return h
}

// reported is the limiter's last report, with Status "closed", once Close
// began, and what the observer reads (observer.go; nil without one).
type reported struct {
	final    atomic.Pointer[Health]
	observed *observedHealth
}

// closeHealth keeps the limiter's last report, with Status "closed", and
// cuts the observer's health function from the limiter, so that an
// exporter, which keeps that function for ever, no longer holds the
// limiter and its store. Close calls it once the background (the probe
// that could recover the limiter) stopped.
func (l *Limiter) closeHealth() {
	h := l.Health()
	h.Status = "closed"
	l.reports().final.Store(&h)
	if o := l.reports().observed; o != nil {
		o.final.Store(&h)
		o.l.Store(nil)
	}
}

// clone is h with slices of its own, for a caller free to change them.
func (h *Health) clone() Health {
	c := *h
	c.Warnings, c.Rules = slices.Clone(h.Warnings), slices.Clone(h.Rules)
	return c
}

// HealthHandler answers health checks with the [Health] report as JSON:
// 200 when healthy, 503 when degraded, never calling the backend. Point
// alerts at it, not a load balancer: every instance degrades at once, and
// taking them all out of rotation turns a backend outage into a full one.
func (l *Limiter) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := l.Health()
		body, err := json.Marshal(h)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		status := http.StatusOK
		if h.Status != "healthy" {
			status = http.StatusServiceUnavailable
		}
		hd := w.Header()
		hd["Content-Type"] = []string{"application/json"}
		hd["Cache-Control"] = []string{"no-store"}
		hd["Content-Length"] = []string{strconv.Itoa(len(body))}
		w.WriteHeader(status)
		if r.Method != http.MethodHead {
			_, _ = w.Write(body)
		}
	})
}

// ErrNotEnforcing is wrapped by [Limiter.Check] when the backend answers but
// admits a request over its limit.
var ErrNotEnforcing = errors.New("ceiling: the backend does not enforce limits")

// Check is a start-up probe: it proves the backend answers, writes and
// rejects, by asking three times for a random canary key limited to 1 per
// day per algorithm the rules use (a backend that admits all three fails
// with [ErrNotEnforcing]); canaries are reset afterwards. A call that misses
// the limiter's timeout is asked again with the budget of the probe that
// confirms a timeout (1s, or the timeout if longer), since a process busy
// at start-up is not a backend failure; ctx bounds the whole check.
//
// A backend that cannot decide makes the limiter degraded at once, and the
// error names the root cause and wraps its kind ([KindOf]). A
// misconfiguration ([backend.ErrAuth], [backend.ErrReadOnly],
// [backend.ErrOutOfMemory], [ErrNotEnforcing]) will not fix itself: refuse
// to start. An unreachable or slow backend is an outage like any other.
func (l *Limiter) Check(ctx context.Context) error {
	var id [8]byte
	_, _ = rand.Read(id[:])
	prefix := "ceiling-check:" + hex.EncodeToString(id[:]) + ":"
	seen := map[backend.Algorithm]bool{}
	var keys []string // canaries the backend may hold
	defer func() {
		if len(keys) > 0 {
			l.checkReset(ctx, keys)
		}
	}()
	for i := range l.rules {
		a := l.rules[i].Algorithm
		if seen[a] {
			continue
		}
		seen[a] = true
		req := backend.Request{Key: prefix + a.String(), Algorithm: a, Limit: 1, Period: 24 * time.Hour, Cost: 1}
		rejected := false
		for attempt := range 3 {
			if a == Concurrency {
				req.Lease = newLease() // three acquisitions, not one renewed
			}
			res, err := l.checkDecide(ctx, req, 0)
			if k := KindOf(err); l.remote && (k == kindTimeout || k == kindOverloaded) {
				// Start-up is not the request path: a process still
				// busy starting, or a first dial, can miss the request
				// timeout. Ask again with a longer budget, on a fresh
				// canary at the first attempt (the late call may have
				// been applied), so that only the backend's failure
				// fails the check and the error names its cause. An
				// answer later than the timeout is asked once more at
				// the timeout, as the probe that confirms timeouts does:
				// a backend slower than the timeout cannot decide in time,
				// and the backend's judgement of that call decides.
				if attempt == 0 {
					keys = append(keys, req.Key)
					req.Key += "+"
				}
				start := time.Now()
				var late error
				res, late = l.checkDecide(ctx, req, max(l.cfg.timeout, confirmBudget))
				if late == nil && time.Since(start) > l.cfg.timeout {
					if attempt == 0 { // a fresh canary again: the late one was applied
						keys = append(keys, req.Key)
						req.Key += "+"
					}
					res, late = l.checkDecide(ctx, req, 0)
				}
				if late == nil {
					err = nil
				} else if KindOf(late) != kindTimeout {
					// The late call's failure is the backend's answer
					// and names the kind; the first call's is only
					// context: a reply this process was too busy to
					// read says nothing once the backend refused one.
					err = fmt.Errorf("%w (%v)", late, err)
				}
			}
			if err != nil {
				return l.checkFailed(err)
			}
			if attempt == 0 {
				keys = append(keys, req.Key)
			}
			if attempt == 0 && !res.Allowed {
				return fmt.Errorf("ceiling: check: canary %q (%s): the backend rejected a request under its limit", req.Key, a)
			}
			if attempt > 0 && !res.Allowed {
				rejected = true
				break
			}
		}
		if !rejected {
			return fmt.Errorf("ceiling: check: canary %q (%s, 1 per day) was admitted 3 times: %w", req.Key, a, ErrNotEnforcing)
		}
	}
	return nil
}

// checkFailed makes the limiter degraded by err, unless this process was
// too busy to hear the backend, and returns Check's error.
func (l *Limiter) checkFailed(err error) error {
	if !l.remote {
		return fmt.Errorf("ceiling: check: the backend did not decide: %w", err)
	}
	if KindOf(err) != kindOverloaded {
		l.trip(err)
	}
	return fmt.Errorf("ceiling: check: the backend did not decide (%s): %w", KindOf(err), err)
}

// checkReset deletes the canaries, waiting at most about the timeout.
func (l *Limiter) checkReset(ctx context.Context, keys []string) {
	if !l.remote {
		_ = l.backend.Reset(ctx, keys...)
		return
	}
	_ = l.bounded(ctx, op{reset: true, keys: keys})
}

func (l *Limiter) checkDecide(ctx context.Context, req backend.Request, timeout time.Duration) (backend.Result, error) {
	reqs, out := []backend.Request{req}, make([]backend.Result, 1)
	var err error
	if l.remote {
		err = l.bounded(ctx, op{reqs: reqs, out: out, timeout: timeout})
	} else {
		err = l.decideInto(ctx, reqs, out)
	}
	return out[0], err
}

// FailureKind is the kind of a backend failure, for reports that must not
// repeat the error's text (addresses, keys): the health report, metric
// labels, logs.
type FailureKind string

// The kinds of failure, as [KindOf] names them.
const (
	kindOverloaded  FailureKind = "overloaded"
	kindUnreachable FailureKind = "unreachable"
	kindTimeout     FailureKind = "timeout"
	kindAuth        FailureKind = "auth"
	kindReadOnly    FailureKind = "read-only"
	kindOutOfMemory FailureKind = "out of memory"
	kindError       FailureKind = "error"
)

// KindOf names the kind of a backend failure, "" for nil. Backends say it
// by wrapping backend's sentinel errors; [backend.ErrNotSent] and
// [backend.ErrUnread] are "overloaded" (this process's fault, not the
// backend's), a call past the limiter's timeout is "timeout", and a refused
// or reset connection is "unreachable" from any backend.
func KindOf(err error) FailureKind {
	switch {
	case err == nil:
		return ""
	case overloaded(err):
		return kindOverloaded
	case errors.Is(err, backend.ErrAuth):
		return kindAuth
	case errors.Is(err, backend.ErrReadOnly):
		return kindReadOnly
	case errors.Is(err, backend.ErrOutOfMemory):
		return kindOutOfMemory
	case errors.Is(err, backend.ErrUnreachable), refused(err):
		return kindUnreachable
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return kindTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return kindTimeout
	}
	return kindError
}

// FailureKinds returns every kind [KindOf] names, for code that must cover
// each (metric labels, alert matchers).
func FailureKinds() []FailureKind {
	return []FailureKind{kindOverloaded, kindUnreachable, kindTimeout, kindAuth, kindReadOnly, kindOutOfMemory, kindError}
}

// isTimeout reports a failure of kind timeout: a cause that the error a
// late call returns may name better (the breaker's LateCause).
func isTimeout(err error) bool { return KindOf(err) == kindTimeout }

// refused reports a connection that could not be made or was lost, from a
// backend that does not say so itself.
func refused(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}
