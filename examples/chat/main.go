// Command chat is an LLM "where is my order" endpoint for a Shopify app:
// POST /api/chat answers a shop's customer about their order, and costs
// money per call, so each shop gets 30 chats per rolling minute, 1000 per
// rolling day and 200,000 model tokens per day, and each client address 300
// requests per rolling minute, all or nothing.
//
// The limiter fails open: when Redis is unreachable a customer still gets an
// answer, and the degradation is logged once, counted, and reported by
// GET /healthz (503 with a JSON reason) and GET /metrics, which are served
// on the admin address only (-admin, loopback by default): they tell
// whoever reads them when the limits are off.
//
// Usage:
//
//	go run ./examples/chat [-addr 127.0.0.1:8080] [-admin 127.0.0.1:9090]
//	go run ./examples/chat -mint-token https://shop-1.myshopify.com [-sub user-1]
//
// Environment: ADDR, ADMIN_ADDR, REDIS_URL (redis://host:6379/0, redis+cluster://h1:6379,h2:6379
// or redis+sentinel://h1:26379,h2:26379/master), DATABASE_URL
// (postgres://user:password@host:5432/db, not with REDIS_URL; without
// either, limits are per process, and the service says so loudly), TRUSTED_PROXIES
// (comma-separated CIDRs of your reverse proxies), IPV6_PREFIX (how many
// leading bits of an IPv6 address are one client; default 64), CHAT_JWT_SECRET (the
// HS256 secret of the session tokens; a development default otherwise),
// KEY_SECRET (HMAC secret of the stored keys), LIMITER_TIMEOUT (how long a
// decision may wait for Redis before failing open; default 100ms) and
// INSTANCES (how many run, for the health report). With
// OTEL_EXPORTER_OTLP_ENDPOINT set it exports each request's span, with the
// limiter's decision on it, and the limiter's metrics over OTLP/HTTP,
// configured by the standard OTEL_* variables; GET /metrics stays
// Prometheus. See README.md.
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
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/service"
)

// devSecret signs tokens when CHAT_JWT_SECRET is unset. It is published in
// this file, so the service warns whenever it uses it.
const devSecret = "chat-development-secret-do-not-deploy"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

// run is main with its inputs as parameters.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	svc := service.Register(fs, getenv)
	mint := fs.String("mint-token", "", "print a one-hour development token for this shop (the dest claim, e.g. https://shop-1.myshopify.com) and exit")
	sub := fs.String("sub", "user-1", "the user (sub claim) of -mint-token")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secret := service.Secret(logger, getenv, "CHAT_JWT_SECRET", devSecret)
	if *mint != "" {
		tok, err := mintToken(secret, *mint, *sub, time.Hour)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, tok)
		return err
	}

	var err error
	cfg := defaultConfig()
	cfg.Config, cfg.Logger, cfg.JWTSecret = *svc, logger, secret
	if cfg.Timeout, err = service.Duration(getenv, "LIMITER_TIMEOUT", cfg.Timeout); err != nil {
		return err
	}
	if cfg.Telemetry, err = newTelemetry(ctx, getenv, logger); err != nil {
		return err
	}
	if stop := cfg.Telemetry.shutdown; stop != nil {
		// After the servers and the limiter: the last spans and counts
		// are flushed.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stop(ctx); err != nil {
				logger.Warn("chat: flushing OpenTelemetry", slog.Any("err", err))
			}
		}()
	}
	h, cleanup, err := newServer(cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	return service.Serve(ctx, svc, h, logger)
}
