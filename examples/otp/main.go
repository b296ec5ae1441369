// Command otp sends one-time passwords by SMS: POST /api/otp with
// {"phone": "+254 700 000 000"} answers 202 and sends a code. Every SMS
// costs money and SMS pumping fraud turns an open endpoint into a bill, so
// each destination number gets 3 codes per rolling 15 minutes, each client
// address 20 requests per rolling 15 minutes, and each signed-in user
// (a valid HS256 bearer token) 5 per rolling hour, all or nothing.
//
// POST /api/reports with {"listing": "flat-42", "reason": "..."} files a
// dispute report: 10 per hour per address and 5 per signed-in user, and a
// listing reported more than 3 times in a day goes on the review list,
// GET /api/review, for the bearer of OTP_ADMIN_TOKEN (at least 32 bytes;
// unset, the list is served to nobody).
//
// The limiter fails closed: when Redis is unreachable the answer is 503
// with Retry-After and no SMS is sent. GET /healthz and GET /metrics are
// served on the admin address only (-admin, loopback by default).
//
// Usage:
//
//	go run ./examples/otp [-addr 127.0.0.1:8080] [-admin 127.0.0.1:9090]
//	go run ./examples/otp -mint-token user-1
//
// Environment: ADDR, ADMIN_ADDR, REDIS_URL (redis://host:6379/0, redis+cluster://h1:6379,h2:6379
// or redis+sentinel://h1:26379,h2:26379/master), DATABASE_URL
// (postgres://user:password@host:5432/db, not with REDIS_URL; without
// either, limits are per process, and the service says so loudly), TRUSTED_PROXIES
// (comma-separated CIDRs of your reverse proxies), IPV6_PREFIX (how many
// leading bits of an IPv6 address are one client; default 64),
// OTP_DEFAULT_REGION (the ISO 3166 code, such as GB or KE, in which a
// number written without "+" is read; unset, only international numbers
// are accepted), OTP_JWT_SECRET (the HS256 secret of user tokens, with
// which -mint-token signs; a development default otherwise), KEY_SECRET
// (HMAC secret of the stored keys, so that Redis holds no recoverable phone
// numbers), LIMITER_TIMEOUT (how long a decision may wait for Redis before
// failing closed; default 100ms) and INSTANCES (how many run, for the
// health report). See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/service"
)

// devSecret verifies user tokens when OTP_JWT_SECRET is unset. It is
// published in this file, so the service warns whenever it uses it.
const devSecret = "otp-development-secret-do-not-deploy"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "otp:", err)
		os.Exit(1)
	}
}

// run is main with its inputs as parameters.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	fs := flag.NewFlagSet("otp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	svc := service.Register(fs, getenv)
	mint := fs.String("mint-token", "", "print a one-hour development token for this user (the sub claim the otp:user rule keys on) and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := defaultConfig()
	cfg.Config, cfg.Logger = *svc, logger
	cfg.JWTSecret = service.Secret(logger, getenv, "OTP_JWT_SECRET", devSecret)
	cfg.Region = strings.ToUpper(strings.TrimSpace(getenv("OTP_DEFAULT_REGION")))
	cfg.AdminToken = getenv("OTP_ADMIN_TOKEN")
	if *mint != "" {
		tok, err := mintToken(cfg.JWTSecret, *mint, time.Hour)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, tok)
		return err
	}
	var err error
	if cfg.Timeout, err = service.Duration(getenv, "LIMITER_TIMEOUT", cfg.Timeout); err != nil {
		return err
	}
	h, cleanup, err := newServer(cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	return service.Serve(ctx, svc, h, logger)
}
