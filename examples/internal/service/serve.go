package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// shutdownTimeout bounds how long requests in flight may take to finish
// once the service is told to stop.
const shutdownTimeout = 5 * time.Second

// Handlers are what a service serves: Public on its listen address, and
// Admin, the operator's GET /healthz and GET /metrics, on its admin
// address (see [DefaultAdminAddr]).
type Handlers struct {
	Public, Admin http.Handler
}

// Serve listens on c.Addr and c.AdminAddr and serves h on them until ctx is
// done, then shuts both down gracefully: it stops accepting, lets requests
// in flight finish (at most shutdownTimeout, then it closes them) and
// returns nil. Both addresses are bound before either serves, and the
// "listening" log line carries both bound addresses, so "-addr 127.0.0.1:0
// -admin 127.0.0.1:0" picks free ports and says which.
func Serve(ctx context.Context, c *Config, h Handlers, logger *slog.Logger) error {
	admin, err := net.Listen("tcp", c.AdminAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (-admin): %w", c.AdminAddr, err)
	}
	public, err := net.Listen("tcp", c.Addr)
	if err != nil {
		admin.Close()
		return fmt.Errorf("listen on %s: %w", c.Addr, err)
	}
	servers := []*http.Server{newHTTPServer(h.Public, logger), newHTTPServer(h.Admin, logger)}
	logger.Info("listening", slog.String("addr", public.Addr().String()), slog.String("admin", admin.Addr().String()))
	errc := make(chan error, 2)
	for i, ln := range []net.Listener{public, admin} {
		go func() { errc <- servers[i].Serve(ln) }()
	}
	select {
	case err := <-errc:
		for _, srv := range servers {
			srv.Close()
		}
		<-errc
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			// Connections still busy (or opened and never used) after the
			// grace period are cut: the process is stopping either way.
			logger.Warn("connections still open after the grace period; closing them", slog.Duration("grace", shutdownTimeout), slog.Any("err", err))
			srv.Close()
		}
	}
	var errs []error
	for range servers {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serve: %w", err))
		}
	}
	return errors.Join(errs...)
}

func newHTTPServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}
