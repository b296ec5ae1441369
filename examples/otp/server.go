package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/service"
	"github.com/golang-jwt/jwt/v5"
)

// Rule names: they appear in RateLimit headers, 429 bodies, metrics and
// stored keys.
const (
	rulePhone = "otp:phone"
	ruleIP    = "otp:ip"
	ruleUser  = "otp:user"
)

// limits are the service's limits; tests shrink them. Each is "at most N in
// any rolling window": a sliding log.
type limits struct {
	PerPhone    int64 // codes per destination number per PhoneWindow
	PhoneWindow time.Duration
	PerIP       int64 // requests per client address per IPWindow
	IPWindow    time.Duration
	PerUser     int64 // codes per signed-in user per UserWindow
	UserWindow  time.Duration

	ReportsPerUser   int64 // dispute reports per signed-in user per ReportUserWindow
	ReportUserWindow time.Duration
	ReportsPerIP     int64 // dispute reports per client address per ReportIPWindow
	ReportIPWindow   time.Duration
	ReviewAfter      int64 // reports of one listing per ReviewWindow before it goes on review
	ReviewWindow     time.Duration
	ReportsHeld      int // reports the review list holds at most
}

// config is everything newServer needs; defaultConfig has production values
// and tests change fields.
type config struct {
	service.Config
	Logger    *slog.Logger
	JWTSecret []byte
	Limits    limits
	// Timeout bounds each limiter decision; past it the request is refused
	// with 503 (the service fails closed).
	Timeout time.Duration
	// Breaker stops paying Timeout on every request while Redis is down.
	Breaker ceiling.BreakerConfig
	// Sender delivers the codes; nil means the logging fake.
	Sender sender
	// Region is the ISO 3166 code (OTP_DEFAULT_REGION, such as "GB") in
	// which a number without "+" is read; empty means only international
	// numbers are accepted.
	Region string
	// AdminToken (OTP_ADMIN_TOKEN, at least 32 bytes) is the bearer token
	// of GET /api/review; empty means the review list is served to nobody.
	AdminToken string
}

func defaultConfig() config {
	return config{
		Logger: slog.Default(),
		Limits: limits{
			PerPhone: 3, PhoneWindow: 15 * time.Minute,
			PerIP: 20, IPWindow: 15 * time.Minute,
			PerUser: 5, UserWindow: time.Hour,
			ReportsPerUser: 5, ReportUserWindow: time.Hour,
			ReportsPerIP: 10, ReportIPWindow: time.Hour,
			ReviewAfter: 3, ReviewWindow: 24 * time.Hour,
			ReportsHeld: 10_000,
		},
		Timeout: 100 * time.Millisecond,
	}
}

// newServer builds the service's handlers: POST /api/otp behind the limiter,
// POST /api/reports and GET /api/review (reports.go) on the public one,
// GET /healthz and GET /metrics on the admin one.
// cleanup releases the Redis client and the limiters; call it after the
// HTTP servers have stopped.
func newServer(cfg config) (h service.Handlers, cleanup func(), err error) {
	if len(cfg.JWTSecret) == 0 {
		return h, nil, errors.New("otp: no JWT secret")
	}
	if cfg.Sender == nil {
		cfg.Sender = logSender{cfg.Logger}
	}
	ip, err := cfg.ClientIP()
	if err != nil {
		return h, nil, err
	}
	if err := checkRegion(cfg.Region); err != nil {
		return h, nil, err
	}
	phone := phoneKey(cfg.Region)
	// Only a token that verifies (HS256 only, not expired) names a user;
	// without one the per-user rule does not apply, and a forged token buys
	// no fresh budget.
	user, err := ceiling.JWTSubject(func(*jwt.Token) (any, error) { return cfg.JWTSecret, nil }, []string{"HS256"})
	if err != nil {
		return h, nil, err
	}
	lim := cfg.Limits
	rules := []ceiling.Rule{
		// The destination first: it is what an SMS pumping attack varies
		// least, and the 429 names the first rule that refused. Hidden: a
		// number's budget is its owner's business, and in the headers
		// anybody could watch a victim's OTP activity.
		{Name: rulePhone, Key: phone, Limit: lim.PerPhone, Period: lim.PhoneWindow, Algorithm: ceiling.SlidingLog, Hidden: true},
		{Name: ruleIP, Key: ip, Limit: lim.PerIP, Period: lim.IPWindow, Algorithm: ceiling.SlidingLog},
		{Name: ruleUser, Key: user, Limit: lim.PerUser, Period: lim.UserWindow, Algorithm: ceiling.SlidingLog},
	}
	obs, metrics := service.Metrics()
	opts, closeBackend, err := cfg.Backend(cfg.Logger, "ceiling:otp")
	if err != nil {
		return h, nil, err
	}
	opts = append(opts,
		// Every SMS costs money and an uncounted one is what an attacker
		// wants: when the limiter cannot decide, nothing is sent.
		ceiling.WithFailMode(ceiling.FailClosed),
		ceiling.WithTimeout(cfg.Timeout),
		ceiling.WithBreaker(cfg.Breaker),
		ceiling.WithLogger(cfg.Logger),
		ceiling.WithObserver(obs),
	)
	limiter, err := ceiling.New(rules, opts...)
	if err != nil {
		closeBackend()
		return h, nil, err
	}
	if err := service.Check(limiter, cfg.Logger, false); err != nil {
		limiter.Close()
		closeBackend()
		return h, nil, err
	}
	reports, err := newReports(cfg, ip, user, opts)
	if err != nil {
		limiter.Close()
		closeBackend()
		return h, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api/otp", limiter.Handler(sendOTP(phone, cfg.Sender, cfg.Logger)))
	mux.Handle("POST /api/reports", reports.file())
	mux.Handle("GET /api/review", reports.review())
	// The health report says when the limits are off and the metrics
	// count each rule's traffic: the operator's, on the admin listener.
	admin := http.NewServeMux()
	admin.Handle("GET /healthz", healthOf(limiter, reports.limiter))
	admin.Handle("GET /metrics", metrics)
	cleanup = func() {
		reports.limiter.Close()
		limiter.Close()
		closeBackend()
	}
	return service.Handlers{Public: mux, Admin: admin}, cleanup, nil
}

// sendOTP sends a fresh code to the body's number. It reads the number with
// phoneKey, the limiter's own key function: the body was parsed once, and
// the number the SMS goes to is, digit for digit, the one that was counted.
func sendOTP(phoneKey ceiling.KeyFunc, s sender, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		phone, err := phoneKey(r)
		if err != nil {
			service.Problem(w, http.StatusBadRequest, err.Error())
			return
		}
		code, err := newCode()
		if err != nil {
			logger.ErrorContext(r.Context(), "generating a code failed", slog.Any("err", err))
			service.Problem(w, http.StatusInternalServerError, "could not generate a code")
			return
		}
		if err := s.Send(r.Context(), phone, code); err != nil {
			logger.ErrorContext(r.Context(), "sending the sms failed", slog.String("to", maskPhone(phone)), slog.Any("err", err))
			service.Problem(w, http.StatusBadGateway, "the sms could not be sent; retry later")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, `{"status":"sent"}`)
	})
}

// newCode returns a uniformly random six-digit code.
func newCode() (string, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%06d", n.Int64()), nil
}

// healthOf reports the first of limiters that is degraded, else the first:
// the OTP and the reports limiters share a backend but each has its own
// breaker, and a service that refuses reports while Redis is down is
// degraded even when no OTP request has found it down yet.
func healthOf(limiters ...*ceiling.Limiter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, l := range limiters {
			if l.Health().Status != "healthy" {
				l.HealthHandler().ServeHTTP(w, r)
				return
			}
		}
		limiters[0].HealthHandler().ServeHTTP(w, r)
	})
}
