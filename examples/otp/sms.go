package main

import (
	"context"
	"log/slog"
)

// A sender delivers a one-time password by SMS.
type sender interface {
	Send(ctx context.Context, phone, code string) error
}

// logSender stands in for an SMS gateway: it logs the masked number (never
// the code, which is as good as a password) instead of sending.
type logSender struct{ logger *slog.Logger }

func (s logSender) Send(ctx context.Context, phone, _ string) error {
	s.logger.InfoContext(ctx, "sms sent (fake)", slog.String("to", maskPhone(phone)))
	return nil
}
