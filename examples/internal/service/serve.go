package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
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
//
// The admin listener tells whoever reads it when the limits are off, so an
// empty admin address, which would bind every interface, is refused, and
// one that binds anything but loopback (":0", "0.0.0.0:9090") is the
// operator's explicit choice, logged as a warning. On loopback, the admin
// listener answers only requests addressed to a loopback name or address:
// a web page whose name an attacker points at 127.0.0.1 (DNS rebinding)
// cannot read it through a browser on the same host.
func Serve(ctx context.Context, c *Config, h Handlers, logger *slog.Logger) error {
	if strings.TrimSpace(c.AdminAddr) == "" {
		return fmt.Errorf("-admin (ADMIN_ADDR) is empty, which would serve GET /healthz and GET /metrics on every interface: give a loopback address such as %s, or an interface's address", DefaultAdminAddr)
	}
	admin, err := net.Listen("tcp", c.AdminAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (-admin): %w", c.AdminAddr, err)
	}
	public, err := net.Listen("tcp", c.Addr)
	if err != nil {
		admin.Close()
		return fmt.Errorf("listen on %s: %w", c.Addr, err)
	}
	adminHandler := h.Admin
	if a, ok := admin.Addr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
		adminHandler = loopbackHostsOnly(h.Admin)
	} else {
		logger.Warn("the admin listener is not on loopback: whoever reaches it can read when the limits are off (GET /healthz) "+
			"and each rule's traffic (GET /metrics); keep it on a private network behind a firewall, or on 127.0.0.1",
			slog.String("admin", admin.Addr().String()))
	}
	servers := []*http.Server{newHTTPServer(h.Public, logger), newHTTPServer(adminHandler, logger)}
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

// loopbackHostsOnly answers 403 to a request whose Host is not a loopback
// name or address: a browser sends the name of the page it loaded, which
// is not "localhost" when an attacker's name resolves to 127.0.0.1.
func loopbackHostsOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			http.Error(w, "the admin listener answers only requests addressed to a loopback name or address", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether host, a Host header with or without its
// port, names the loopback interface. An empty Host (HTTP/1.0) names
// nothing a browser would have resolved, and is let through.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
