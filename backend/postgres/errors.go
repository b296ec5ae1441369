package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/jackc/pgx/v5/pgconn"
)

// classify wraps err with the kind of failure its cause shows, so that the
// limiter's breaker, fail modes, health and metrics tell them apart:
//
//   - wrong or missing credentials (28P01, 28000): [backend.ErrAuth];
//   - a standby or a read-only transaction (25006): [backend.ErrReadOnly];
//   - a statement timeout or a cancelled query (57014), and a deadline
//     that passed: context.DeadlineExceeded, which ceiling reports as a
//     timeout;
//   - a refused, reset or lost connection, a server shutting down or not
//     yet accepting connections (57P01..57P03), a session ended for being
//     idle (57P05), class 08, too many connections (53300):
//     [backend.ErrUnreachable];
//   - a full disk or out of memory (53100, 53200): [backend.ErrOutOfMemory].
//
// Anything else is returned as is.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "28P01" || pe.Code == "28000":
			return fmt.Errorf("%w: %w", backend.ErrAuth, err)
		case pe.Code == "25006":
			return fmt.Errorf("%w: %w", backend.ErrReadOnly, err)
		case pe.Code == "57014":
			return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		case pe.Code == "53100" || pe.Code == "53200":
			return fmt.Errorf("%w: %w", backend.ErrOutOfMemory, err)
		case strings.HasPrefix(pe.Code, "08"), pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "57P05", pe.Code == "53300":
			return fmt.Errorf("%w: %w", backend.ErrUnreachable, err)
		}
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", backend.ErrUnreachable, err)
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("%w: %w", backend.ErrUnreachable, err)
	}
	return err
}
