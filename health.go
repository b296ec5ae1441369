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
// in-process backend (the default memory store) and n > 1, every instance
// enforces the full limit: the limiter logs a warning at start-up and its
// health report carries it, since the effective limit is up to n times the
// configured one. With a shared backend it sizes [FailLocal]'s share to 1/n
// of each limit (and burst), so that n instances deciding locally together
// admit about one limit's worth; a rule's local limit is never below its
// cost, so a request can still fit.
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

// warnPlatform warns, when the limiter counts in process with no
// [WithInstances], that the environment looks like a platform that runs
// several instances: each would enforce the full limit. It does not guess
// how many. Logged once per process; every such limiter's health report
// keeps it.
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

// notes are a limiter's warnings about its own configuration, found in New
// or in its first requests, for [Limiter.Health].
type notes struct {
	mu   sync.Mutex
	list []string
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

func (n *notes) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.list)
}

// Health is the limiter's state as [Limiter.HealthHandler] reports it.
type Health struct {
	// Status is "healthy" (the backend decides) or "degraded" (the circuit
	// breaker is open and the rules' fail modes decide).
	Status string `json:"status"`
	// Reason is, when degraded, the kind of the latest backend failure
	// ([KindOf]). It never holds the error's text, which can name
	// addresses, stored keys and scripts; the log has the whole error.
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
	// Warnings are configurations weaker than they read, such as an
	// in-process backend with several instances. They do not make the
	// limiter degraded.
	Warnings []string `json:"warnings,omitempty"`
	// DegradedTotal counts healthy → degraded transitions since start.
	DegradedTotal int64 `json:"degraded_total"`
	// EvictedKeys counts keys the in-process stores (the memory backend,
	// FailLocal's store) evicted while they held spent units, to stay under
	// their key bound: each gave a caller quota back. Above zero, the bound
	// is too small for the keys in use, or fresh keys are flooding in.
	EvictedKeys uint64 `json:"evicted_keys,omitempty"`
	// DroppedWrites counts the requests of settlements and slot releases
	// that failed and were not applied later either: the limiter resends
	// them in the background once the backend answers, but gives up on a
	// refund that may already have been applied, on one pending for longer
	// than its rule's Period, and on what is pending at Close. Each left
	// units counted (a reservation at its estimate, a slot until its lease
	// ends) that the caller did not use: an error towards the limit.
	DroppedWrites int64 `json:"dropped_writes,omitempty"`
	// Shed counts requests refused with 503 because this process was too
	// busy to send their backend call or read its reply within the timeout
	// (see [backend.ErrNotSent]), or because a FailOpen rule's call timed
	// out before a probe confirmed that the backend is at fault: an
	// overloaded instance sheds load rather than admit unmetered.
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
	// SlotsInUse is, for a [Concurrency] rule, how many units of its
	// Limit this process holds now: the slots of the requests it admitted
	// (on the backend or on FailLocal's store) that have not yet ended.
	// Other instances' slots are not in it. Zero for other algorithms.
	SlotsInUse int64 `json:"slots_in_use,omitempty"`
}

// Health returns the limiter's current state. It makes no backend call: it
// reports what the requests and the background probes saw, so a health
// check costs the backend nothing. While degraded, the limiter probes the
// backend itself about every second, so the report turns healthy again
// within about a second of the backend answering, with or without traffic.
func (l *Limiter) Health() Health {
	h := Health{
		Status:   "healthy",
		Backend:  "in-process",
		FailMode: l.cfg.failMode.String(),
		Rules:    make([]RuleHealth, len(l.rules)),
	}
	h.Warnings = l.engineWarnings()
	h.Warnings = append(h.Warnings, l.keyWarnings()...)
	h.Warnings = append(h.Warnings, spoofable.list()...)
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

// HealthHandler answers health checks with the [Health] report as JSON:
// 200 when healthy, 503 when degraded. It never calls the backend.
//
// Mind what a 503 does where you point it: an uptime check or an alert
// should see it; a load balancer that takes degraded instances out of
// rotation turns a Redis outage into a full outage even for rules that fail
// open or local, since every instance is degraded at once.
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

// Check is a start-up probe: it proves the backend answers, can write, and
// actually rejects. For each algorithm the rules use it asks for a canary
// key limited to 1 per day, three times: the first must be admitted and a
// later one rejected (a backend that admits everything fails with
// [ErrNotEnforcing]). Canary keys are random and reset afterwards. Each
// call is bounded by the limiter's timeout (one that times out is given up
// to 2s more to name its cause); ctx bounds the whole check.
//
// When the backend cannot decide, the error names the root cause and wraps
// its kind (see [KindOf]): wrong or missing credentials
// ([backend.ErrAuth]), a read-only replica ([backend.ErrReadOnly]), a full
// server ([backend.ErrOutOfMemory]), an unreachable ([backend.ErrUnreachable])
// or slow ([ErrTimeout]) one. The limiter then becomes degraded at once
// (logged, reported to the [Observer] and by [Limiter.Health]) and probes the
// backend in the background like after any failure.
//
// What to do with the error is the service's call. A misconfiguration
// (credentials, a replica, a full server, [ErrNotEnforcing]) will not fix
// itself: refuse to start. An unreachable backend is an outage like any
// other: a service whose rules fail open or local may start degraded, and
// say so loudly; one that fails closed serves only 503s until the backend
// answers, so refusing to start may be clearer.
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
			res, err := l.checkDecide(ctx, req)
			if err != nil {
				return l.checkFailed(ctx, err, req)
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

// lateCauseWait bounds how long Check asks again, after a timeout, for
// the backend to say what went wrong: twenty timeouts, at most 2s.
func (l *Limiter) lateCauseWait() time.Duration { return min(2*time.Second, 20*l.cfg.timeout) }

// checkFailed makes the limiter degraded by err and returns Check's error.
// A timeout may hide the root cause: go-redis retrying a refused dial or a
// READONLY reply past the timeout, or a process too busy at start-up to
// read a wrong password's reply in time. Check asks req again with a
// longer timeout, so that the error names the cause; it stays a timeout
// when the longer call answers.
func (l *Limiter) checkFailed(ctx context.Context, err error, req backend.Request) error {
	if !l.remote {
		return fmt.Errorf("ceiling: check: the backend did not decide: %w", err)
	}
	l.trip(err)
	cause := err
	if KindOf(err) == kindTimeout {
		out := make([]backend.Result, 1)
		if e := l.bounded(ctx, op{reqs: []backend.Request{req}, out: out, timeout: l.lateCauseWait()}); e != nil && KindOf(e) != kindTimeout {
			cause = fmt.Errorf("%w (%w)", e, err)
		}
	}
	return fmt.Errorf("ceiling: check: the backend did not decide (%s): %w", KindOf(cause), cause)
}

// checkReset deletes the canaries, waiting at most about the timeout.
func (l *Limiter) checkReset(ctx context.Context, keys []string) {
	if !l.remote {
		_ = l.backend.Reset(ctx, keys...)
		return
	}
	_ = l.bounded(ctx, op{reset: true, keys: keys})
}

func (l *Limiter) checkDecide(ctx context.Context, req backend.Request) (backend.Result, error) {
	reqs, out := []backend.Request{req}, make([]backend.Result, 1)
	var err error
	if l.remote {
		err = l.bounded(ctx, op{reqs: reqs, out: out})
	} else {
		err = l.decideInto(ctx, reqs, out)
	}
	return out[0], err
}

// FailureKind is the kind of a backend failure, for reports that must not
// repeat the error's text (it can name addresses, stored keys, script
// hashes): the health report's Reason, metric labels, logs. [KindOf] tells
// it from an error, and [FailureKinds] lists every kind.
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

// KindOf names the kind of a backend failure: "overloaded" (a call this
// process never got to send, [backend.ErrNotSent], or whose reply it was
// too busy to read, [backend.ErrUnread]: not the backend's failure), "unreachable", "timeout", "auth", "read-only", "out of
// memory", or "error" for any other; "" for nil. Backends say the kind by
// wrapping [backend.ErrUnreachable], [backend.ErrAuth],
// [backend.ErrReadOnly], [backend.ErrOutOfMemory], [backend.ErrNotSent] or
// [backend.ErrUnread];
// a call that outlived the limiter's timeout is a "timeout" ([ErrTimeout]),
// and a refused or reset connection is "unreachable" even from a backend
// that does not wrap it.
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

// FailureKinds returns every kind [KindOf] names, in that order, for code
// that must cover each (a metric's label values, an alert's matcher).
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
