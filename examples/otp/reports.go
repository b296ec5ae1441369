package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/service"
)

// Rule names of the dispute reports.
const (
	ruleReportUser    = "report:user"
	ruleReportIP      = "report:ip"
	ruleReportListing = "report:listing"
)

// minAdminToken is the shortest OTP_ADMIN_TOKEN the service takes: the
// token is all that stands between anybody and the review list.
const minAdminToken = 32

// reportRules limit dispute reports. One person filing many reports is
// suspicious, so the reporter's rules reject: per signed-in user and per
// client address. Many people reporting one listing is a genuine problem
// or a coordinated attack, and either way worth a human look rather than
// a silent block, so the listing's rule is a shadow rule: it never
// rejects, and the report that finds it past its threshold puts the
// listing on the review list. It is Hidden as well: how often a listing
// is reported is nobody's business but the reviewers'.
func reportRules(lim limits) []ceiling.Rule {
	return []ceiling.Rule{
		{Name: ruleReportUser, Limit: lim.ReportsPerUser, Period: lim.ReportUserWindow, Algorithm: ceiling.SlidingLog},
		{Name: ruleReportIP, Limit: lim.ReportsPerIP, Period: lim.ReportIPWindow, Algorithm: ceiling.SlidingLog},
		{Name: ruleReportListing, Limit: lim.ReviewAfter, Period: lim.ReviewWindow, Algorithm: ceiling.SlidingLog, Shadow: true, Hidden: true},
	}
}

// reports serves POST /api/reports and GET /api/review. Its limiter is
// its own (its rules are decided with Decide, not by a middleware in front
// of the OTP endpoint), on the same backend as the OTP limiter.
type reports struct {
	limiter *ceiling.Limiter
	ip      ceiling.KeyFunc
	user    ceiling.KeyFunc
	list    *reviewList
	token   [sha256.Size]byte // of OTP_ADMIN_TOKEN; zero when unset
	logger  *slog.Logger
}

// newReports checks the admin token and builds the reports' limiter with
// the service's limiter options.
func newReports(cfg config, ip, user ceiling.KeyFunc, opts []ceiling.Option) (*reports, error) {
	rp := &reports{ip: ip, user: user, logger: cfg.Logger, list: newReviewList(cfg.Limits.ReportsHeld)}
	switch n := len(cfg.AdminToken); {
	case n == 0:
		cfg.Logger.Warn("OTP_ADMIN_TOKEN is not set: GET /api/review refuses everybody; listings flagged for review are still logged")
	case n < minAdminToken:
		return nil, fmt.Errorf("OTP_ADMIN_TOKEN is %d bytes: want at least %d, e.g. from `openssl rand -hex 32`", n, minAdminToken)
	default:
		rp.token = sha256.Sum256([]byte(cfg.AdminToken))
	}
	l, err := ceiling.New(reportRules(cfg.Limits), opts...)
	if err != nil {
		return nil, err
	}
	rp.limiter = l
	return rp, nil
}

// A reportBody is what POST /api/reports takes.
type reportBody struct {
	Listing string `json:"listing"`
	Reason  string `json:"reason"`
}

// listingID is what a listing's id may look like: the key of the shadow
// rule and of the review list, so never free text.
var listingID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// maxReason bounds a report's reason, in characters.
const maxReason = 280

// maxReportBody bounds a report's body: room for the longest valid
// report however its client's JSON encoder writes it, up to 12 bytes a
// character for one escaped as a surrogate pair (\ud83d\ude00), so
// that no reason maxReason admits is refused as too large.
const maxReportBody = 4 << 10

// file files a dispute report: 202 when it is recorded, 429 when its
// reporter has filed too many, 503 (with Retry-After) when the limiter
// cannot decide. A report is either recorded or refused with a status
// that says so: never dropped. The answer does not say whether the
// listing is on review.
func (rp *reports) file() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b reportBody
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReportBody))
		dec.DisallowUnknownFields()
		err := dec.Decode(&b)
		if err == nil && dec.More() {
			err = errors.New("more than one JSON value")
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				service.Problem(w, http.StatusRequestEntityTooLarge, "a report is at most 4 KiB")
				return
			}
			service.Problem(w, http.StatusBadRequest, `want {"listing": "...", "reason": "..."}`)
			return
		}
		b.Reason = strings.TrimSpace(b.Reason)
		switch {
		case !listingID.MatchString(b.Listing):
			service.Problem(w, http.StatusBadRequest, "listing: want the listing's id, 1 to 64 letters, digits, '-' or '_'")
			return
		case b.Reason == "" || utf8.RuneCountInString(b.Reason) > maxReason:
			service.Problem(w, http.StatusBadRequest, fmt.Sprintf("reason: want 1 to %d characters", maxReason))
			return
		}
		addr, err := rp.ip(r)
		if err != nil {
			service.Problem(w, http.StatusBadRequest, err.Error())
			return
		}
		inputs := []ceiling.Input{{Rule: ruleReportIP, Key: addr}, {Rule: ruleReportListing, Key: b.Listing}}
		// A verified token names the reporter; without one (or with one
		// that does not verify) only the address counts.
		if u, err := rp.user(r); err == nil {
			inputs = append(inputs, ceiling.Input{Rule: ruleReportUser, Key: u})
		}
		// The room is held while the report is decided: a report admitted
		// and then refused for a full list would have spent its
		// reporter's budget for nothing.
		if !rp.list.reserve() {
			rp.full(w, r, b.Listing)
			return
		}
		d, err := rp.limiter.Decide(r.Context(), inputs...)
		if err != nil {
			rp.list.unreserve()
			rp.undecided(w, r, err)
			return
		}
		h := w.Header()
		if v := rp.limiter.RateLimitPolicy(&d); v != "" {
			h.Set("RateLimit-Policy", v)
		}
		if v := d.RateLimit(); v != "" {
			h.Set("RateLimit", v)
		}
		if !d.Allowed {
			rp.list.unreserve()
			// Retry-After is the middleware's to set; a caller of Decide
			// sets it from the problem body, which says when every rule
			// it names admits the report.
			if p := ceiling.RejectionProblem(&d); p.RetryAfter > 0 {
				h.Set("Retry-After", strconv.FormatInt(p.RetryAfter, 10))
			}
			ceiling.WriteRejection(w, r, &d)
			return
		}
		review := false
		for _, rr := range d.Results {
			// The shadow rule would have refused: the listing is past its
			// threshold. A rule a fail mode decided says nothing about it.
			if rr.Rule.Name == ruleReportListing && !rr.Allowed && rr.Fallback == 0 {
				review = true
			}
		}
		n, flagged := rp.list.add(b.Listing, b.Reason, review)
		if flagged {
			rp.logger.WarnContext(r.Context(), "listing flagged for review", slog.String("listing", b.Listing), slog.Int("reports", n))
		}
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, `{"status":"received"}`)
	})
}

// undecided answers a report the limiter could not decide: 503 with
// Retry-After when it fails closed, 500 for anything else (a bug: the
// inputs are the service's own).
func (rp *reports) undecided(w http.ResponseWriter, r *http.Request, err error) {
	var ue *ceiling.UnavailableError
	if !errors.As(err, &ue) {
		rp.logger.ErrorContext(r.Context(), "deciding a report failed", slog.Any("err", err))
		service.Problem(w, http.StatusInternalServerError, "the report could not be filed")
		return
	}
	unavailable(w, ue.RetryAfter)
}

// unavailable refuses a report for now as ceiling refuses a request it
// cannot decide: 503 with Retry-After, in the header and the body.
func unavailable(w http.ResponseWriter, retry time.Duration) {
	secs := max(int64((retry+time.Second-1)/time.Second), 1)
	body, _ := json.Marshal(ceiling.Problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the report could not be filed right now; retry later", RetryAfter: secs})
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(body)
}

// full refuses a report that the review list has no room for, loudly: the
// reporter is told to retry and the operator is told why.
func (rp *reports) full(w http.ResponseWriter, r *http.Request, listing string) {
	rp.logger.ErrorContext(r.Context(), "the review list is full: report refused; review and clear listings, or raise the limit",
		slog.String("listing", listing), slog.Int("held", rp.list.max))
	unavailable(w, time.Minute)
}

// review serves the review list to a request that carries the admin
// token as a bearer token.
func (rp *reports) review() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rp.token == [sha256.Size]byte{} {
			service.Problem(w, http.StatusForbidden, "the review list is off: the service has no OTP_ADMIN_TOKEN")
			return
		}
		// The scheme is case-insensitive (RFC 9110 section 11.1).
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		ok = ok && strings.EqualFold(scheme, "Bearer")
		if sum := sha256.Sum256([]byte(tok)); !ok || subtle.ConstantTimeCompare(sum[:], rp.token[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="review"`)
			service.Problem(w, http.StatusUnauthorized, "the review list needs the admin token")
			return
		}
		body, err := json.Marshal(map[string]any{"review": rp.list.flaggedListings()})
		if err != nil {
			service.Problem(w, http.StatusInternalServerError, "the review list could not be written")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(body, '\n'))
	})
}

// A reviewList holds the reports the service accepted, by listing, and
// which listings are on review. It lives in this process's memory, so
// each instance has its own: a real service writes reports to its
// database. It holds at most max reports, so that nobody can fill the
// memory with reports of made-up listings; past it reports are refused
// (and logged), never dropped. It is safe for simultaneous use.
type reviewList struct {
	mu       sync.Mutex
	max      int
	held     int
	reserved int // reports being decided, each with its room held
	listings map[string]*reported
	flagged  []string // the listings on review, in the order they went on it
}

// reported is one listing's reports.
type reported struct {
	reasons []string
	review  bool
}

func newReviewList(max int) *reviewList {
	return &reviewList{max: max, listings: map[string]*reported{}}
}

// reserve holds room for one report while it is decided, and reports
// false when the list has none. Each reservation ends with add or
// unreserve.
func (l *reviewList) reserve() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held+l.reserved >= l.max {
		return false
	}
	l.reserved++
	return true
}

// unreserve gives back the room of a report that was not recorded.
func (l *reviewList) unreserve() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserved--
}

// add records a report of listing in the room reserve held for it,
// putting the listing on review when review is set. It returns the
// listing's reports and whether this report put it on review.
func (l *reviewList) add(listing, reason string, review bool) (n int, flagged bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserved--
	rp := l.listings[listing]
	if rp == nil {
		rp = &reported{}
		l.listings[listing] = rp
	}
	rp.reasons = append(rp.reasons, reason)
	l.held++
	if review && !rp.review {
		rp.review, flagged = true, true
		l.flagged = append(l.flagged, listing)
	}
	return len(rp.reasons), flagged
}

// A flaggedListing is one entry of GET /api/review: every report the
// listing received, those before it went on review included.
type flaggedListing struct {
	Listing string   `json:"listing"`
	Reports int      `json:"reports"`
	Reasons []string `json:"reasons"`
}

// flaggedListings returns the listings on review, in the order they went
// on it.
func (l *reviewList) flaggedListings() []flaggedListing {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]flaggedListing, 0, len(l.flagged))
	for _, id := range l.flagged {
		rp := l.listings[id]
		out = append(out, flaggedListing{Listing: id, Reports: len(rp.reasons), Reasons: append([]string(nil), rp.reasons...)})
	}
	return out
}
