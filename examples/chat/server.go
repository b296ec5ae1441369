package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/examples/internal/service"
)

// Rule names: they appear in RateLimit headers, 429 bodies, metrics and
// stored keys.
const (
	ruleMinute  = "chat:shop:minute"
	ruleDay     = "chat:shop:day"
	ruleIP      = "chat:ip"
	ruleTokens  = "chat:shop:tokens"
	ruleAnswers = "chat:shop:answers"
)

// maxBody bounds a chat message's request body.
const maxBody = 16 << 10

// limits are the service's limits; tests shrink them. Each count is per
// rolling window except Tokens, a budget per aligned window (a UTC day),
// and Answers, how many answers a shop may have in flight at once (each a
// lease of AnswerLease, renewed while the answer runs).
type limits struct {
	PerMinute, PerDay, PerIP, Tokens   int64
	Minute, Day, IPWindow, TokenWindow time.Duration
	Answers                            int64
	AnswerLease                        time.Duration
}

// config is everything newServer needs; defaultConfig has production values
// and tests change fields.
type config struct {
	service.Config
	Logger    *slog.Logger
	JWTSecret []byte
	Limits    limits
	// Timeout bounds each limiter decision; past it the request is
	// admitted (the service fails open) and the degradation reported.
	Timeout time.Duration
	// Breaker stops paying Timeout on every request while Redis is down.
	Breaker ceiling.BreakerConfig
	// Orders finds the shop's order; Model answers the message, in at
	// most MaxOutputTokens tokens of reply.
	Orders          func(ctx context.Context, shop string) (Order, error)
	Model           func(message string, o Order, maxOutput int64) (reply string, tokens int64)
	MaxOutputTokens int64
	// Telemetry exports spans and metrics over OTLP; the zero value
	// exports nothing.
	Telemetry telemetry
}

func defaultConfig() config {
	return config{
		Logger: slog.Default(),
		Limits: limits{
			PerMinute: 30, Minute: time.Minute,
			PerDay: 1000, Day: 24 * time.Hour,
			PerIP: 300, IPWindow: time.Minute,
			Tokens: 200_000, TokenWindow: 24 * time.Hour,
			Answers: 4, AnswerLease: time.Minute,
		},
		Timeout:         100 * time.Millisecond,
		Orders:          fakeOrders(lookupLatency),
		Model:           fakeModel,
		MaxOutputTokens: 512,
	}
}

// server holds the chat endpoint's dependencies.
type server struct {
	cfg    config
	orders *ceiling.Prefetched[Order]
}

// newServer builds the service's handlers: POST /api/chat behind the limiter
// on the public one, GET /healthz and GET /metrics on the admin one.
// cleanup releases the Redis client and the limiter; call it after the
// HTTP servers have stopped.
func newServer(cfg config) (h service.Handlers, cleanup func(), err error) {
	if len(cfg.JWTSecret) == 0 {
		return h, nil, errors.New("chat: no JWT secret")
	}
	ip, err := cfg.ClientIP()
	if err != nil {
		return h, nil, err
	}
	s := &server{cfg: cfg}
	// The lookup starts as soon as the limiter knows the keys, while it
	// waits for Redis; the handler picks up the result, and a rejected
	// request cancels it and never sees it.
	s.orders = ceiling.Prefetch("order", func(ctx context.Context, r *http.Request) (Order, error) {
		c, ok := claimsFrom(r)
		if !ok {
			return Order{}, errUnauthenticated
		}
		return cfg.Orders(ctx, c.Shop)
	})

	lim := cfg.Limits
	rules := []ceiling.Rule{
		// "30 per minute" means at most 30 in any rolling minute: a sliding
		// log, not a token bucket (which would admit up to 59 in the
		// first minute).
		{Name: ruleMinute, Key: shopKey, Limit: lim.PerMinute, Period: lim.Minute, Algorithm: ceiling.SlidingLog},
		{Name: ruleDay, Key: shopKey, Limit: lim.PerDay, Period: lim.Day, Algorithm: ceiling.SlidingLog},
		{Name: ruleIP, Key: ip, Limit: lim.PerIP, Period: lim.IPWindow, Algorithm: ceiling.SlidingLog},
		// The token budget's real cost is known only after the reply, so
		// each request reserves the most it can cost (its prompt and the
		// model's longest answer) when it is decided, and the handler
		// settles what the model reports. Concurrent requests can then
		// never take the day past its budget: a reservation that does not
		// fit is a 429 before any work. A fixed window is a budget per UTC
		// day and costs two integers, where a log of 200,000 entries
		// would not. Its unit goes in RateLimit-Policy (qu="tokens"), so
		// that a client reads its q as tokens, not requests.
		{Name: ruleTokens, Key: shopKey, Limit: lim.Tokens, Period: lim.TokenWindow, Algorithm: ceiling.FixedWindow,
			Estimate: s.reserveTokens, Unit: "tokens"},
		// A model answer costs by how long it runs, not by the count: at
		// most 4 answers of one shop at once, on every instance together.
		// The slot is taken with the other rules, all or nothing, and
		// given back when the handler returns (or the client leaves); an
		// instance that dies gives its slots back within the lease.
		{Name: ruleAnswers, Key: shopKey, Limit: lim.Answers, Period: lim.AnswerLease, Algorithm: ceiling.Concurrency},
	}
	obs, metrics := service.Metrics()
	opts, closeBackend, err := cfg.Backend(cfg.Logger, "ceiling:chat")
	if err != nil {
		return h, nil, err
	}
	opts = append(opts,
		ceiling.WithFailMode(ceiling.FailOpen),
		ceiling.WithTimeout(cfg.Timeout),
		ceiling.WithBreaker(cfg.Breaker),
		ceiling.WithLogger(cfg.Logger),
		ceiling.WithObserver(obs),
		ceiling.WithPrefetch(s.orders),
	)
	if o := cfg.Telemetry.observer; o != nil {
		opts = append(opts, ceiling.WithObserver(o))
	}
	limiter, err := ceiling.New(rules, opts...)
	if err != nil {
		closeBackend()
		return h, nil, err
	}
	if err := service.Check(limiter, cfg.Logger, true); err != nil {
		limiter.Close()
		closeBackend()
		return h, nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /api/chat", authenticate(cfg.JWTSecret, limiter.Handler(http.HandlerFunc(s.chat))))
	// The health report says when the limits are off and the metrics
	// count each rule's traffic: the operator's, on the admin listener.
	admin := http.NewServeMux()
	admin.Handle("GET /healthz", limiter.HealthHandler())
	admin.Handle("GET /metrics", metrics)
	cleanup = func() {
		limiter.Close()
		closeBackend()
	}
	public := http.Handler(mux)
	if wrap := cfg.Telemetry.wrap; wrap != nil {
		public = wrap(mux)
	}
	return service.Handlers{Public: public, Admin: admin}, cleanup, nil
}

var errUnauthenticated = errors.New("no valid bearer token")

// shopKey keys by the shop of a verified token. Without one the per-shop
// rules do not apply, so nobody spends a shop's budget without the shop's
// signature.
func shopKey(r *http.Request) (string, error) {
	c, ok := claimsFrom(r)
	if !ok {
		return "", ceiling.ErrNoKey
	}
	return c.Shop, nil
}

// chatRequest is the body of POST /api/chat.
type chatRequest struct {
	Message string `json:"message"`
}

// chatReply is the body of a 200 answer.
type chatReply struct {
	Reply  string `json:"reply"`
	Order  Order  `json:"order"`
	Tokens int64  `json:"tokens"`
}

// messageField reads the body's message for the token reservation, parsing
// the body once for the limiter and leaving it whole for the handler.
var messageField = ceiling.Must(ceiling.BodyField("message", ceiling.BodyLimit(maxBody)))

// reserveTokens is the token rule's Estimate: the most r can cost, its
// prompt (the instructions, the order and the message) plus the longest
// answer the model may give. A body over maxBody is a 413 before anything
// counts; a malformed one reserves the least a message costs, and is
// answered 400 (and settled at nothing) by the handler, after the request
// rules have counted it.
func (s *server) reserveTokens(r *http.Request) (int64, error) {
	msg, err := messageField(r)
	if err != nil && !errors.Is(err, ceiling.ErrNoKey) {
		var tooLarge *http.MaxBytesError
		if errors.Is(err, ceiling.ErrBodyTooLarge) || errors.Is(err, ceiling.ErrBodyTimeout) || errors.As(err, &tooLarge) {
			return 0, err
		}
		msg = ""
	}
	return promptTokens(msg) + s.cfg.MaxOutputTokens, nil
}

// unused settles the token reservation of a request that never reached the
// model: it cost nothing.
func (s *server) unused(r *http.Request) {
	if err := ceiling.Settle(r, ruleTokens, 0); err != nil && !errors.Is(err, ceiling.ErrNotReserved) {
		s.cfg.Logger.ErrorContext(r.Context(), "releasing the token reservation failed", slog.Any("err", err))
	}
}

// chat answers one message. The limiter has admitted the request; it may
// still be unauthenticated (only the per-address rule applied) or malformed
// (it counted all the same: a client cannot probe for free, but it spends
// no tokens).
func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	c, ok := claimsFrom(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="chat", error="invalid_token"`)
		service.Problem(w, http.StatusUnauthorized, "a valid bearer token (HS256, with dest and sub) is required")
		return
	}
	var body chatRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooLarge *http.MaxBytesError
		s.unused(r)
		if errors.As(err, &tooLarge) {
			service.Problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", maxBody))
			return
		}
		service.Problem(w, http.StatusBadRequest, `the body must be JSON: {"message": "..."}`)
		return
	}
	if strings.TrimSpace(body.Message) == "" {
		s.unused(r)
		service.Problem(w, http.StatusBadRequest, "the message is empty")
		return
	}
	order, err := s.orders.Get(r)
	if err != nil {
		s.unused(r)
		s.cfg.Logger.ErrorContext(r.Context(), "order lookup failed", slog.String("shop", c.Shop), slog.Any("err", err))
		service.Problem(w, http.StatusBadGateway, "the order lookup failed; retry later")
		return
	}
	reply, tokens := s.cfg.Model(body.Message, order, s.cfg.MaxOutputTokens)
	// Charge the budget with what the model really used, at most the
	// reservation. When the limiter failed open there is no reservation to
	// settle: the request was not counted at all, and the health report
	// says so.
	if err := ceiling.Settle(r, ruleTokens, tokens); err != nil && !errors.Is(err, ceiling.ErrNotReserved) {
		s.cfg.Logger.ErrorContext(r.Context(), "charging the token budget failed", slog.Any("err", err))
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(chatReply{Reply: reply, Order: order, Tokens: tokens})
}
