package servicetest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A Misconfigured Redis is a real redis-server set up so that a service
// must refuse to start on it, and what the refusal must name.
type Misconfigured struct {
	Name     string
	RedisURL string
	Cause    []string // the error names one of these
}

// Misconfigurations starts one redis-server per mistake a deployment makes:
// a missing or wrong password, a read-only replica, a full server
// (maxmemory with noeviction). They stop when the test ends.
func Misconfigurations(t *testing.T) []Misconfigured {
	t.Helper()
	auth := redistest.ServerWith(t, "requirepass s3cret")
	master := redistest.Server(t)
	_, port, _ := net.SplitHostPort(master.Addr)
	replica := redistest.ServerWith(t, "replicaof 127.0.0.1 "+port)
	full := redistest.Server(t)
	full.Fill(t)
	return []Misconfigured{
		{"no password", "redis://" + auth.Addr + "/0", []string{"NOAUTH", "unauthenticated"}},
		{"wrong password", "redis://:guess@" + auth.Addr + "/0", []string{"WRONGPASS"}},
		{"read-only replica", "redis://" + replica.Addr + "/0", []string{"READONLY"}},
		{"full", "redis://" + full.Addr + "/0", []string{"OOM"}},
	}
}

// Exit runs bin (with "-addr 127.0.0.1:0 -admin 127.0.0.1:0", then args,
// which may override them) with an environment of only PATH plus env, and
// waits at most timeout for it to exit. It returns what the service logged
// and its exit code, or -1 when it was still running at the timeout (it is
// then killed).
func Exit(t *testing.T, bin string, env []string, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return out.String(), -1
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), exit.ExitCode()
	}
	if err != nil {
		t.Fatalf("running %s: %v", bin, err)
	}
	return out.String(), 0
}

// ContainsAny reports whether s holds one of subs.
func ContainsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
