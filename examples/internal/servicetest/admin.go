package servicetest

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notLoopback is the start of the warning a service logs when its admin
// listener binds more than loopback.
const notLoopback = "the admin listener is not on loopback"

// AdminAddresses fails t unless bin, started with env, keeps its admin
// listener (GET /healthz, GET /metrics) to the operator: an empty admin
// address is refused at start with an error naming it; one that binds
// every interface, from -admin or ADMIN_ADDR, is served with one warning;
// a loopback one is served silently; and on loopback the admin endpoints
// answer only requests addressed to a loopback name or address, never a
// page whose name an attacker pointed at 127.0.0.1 (DNS rebinding).
func AdminAddresses(t *testing.T, bin string, env []string) {
	t.Helper()
	if log, code := Exit(t, bin, env, startTimeout, "-admin", ""); code <= 0 || !strings.Contains(log, "-admin (ADMIN_ADDR) is empty") {
		t.Errorf("-admin \"\": exit code %d, want a refusal naming -admin:\n%s", code, log)
	}
	for _, tc := range []struct {
		env  []string
		args []string
		warn int
	}{
		{args: []string{"-admin", ":0"}, warn: 1},
		{args: []string{"-admin", "0.0.0.0:0"}, warn: 1},
		{args: []string{"-admin", "[::]:0"}, warn: 1},
		{env: []string{"ADMIN_ADDR=:0"}, warn: 1},
		{args: []string{"-admin", "localhost:0"}, warn: 0},
		{env: []string{"ADMIN_ADDR=127.0.0.1:0"}, warn: 0},
	} {
		log := startupLog(t, bin, append(append([]string(nil), env...), tc.env...), tc.args...)
		if got := strings.Count(log, notLoopback); got != tc.warn || !listening.MatchString(log) {
			t.Errorf("admin %q %q: %d warnings, want %d, and the service listening:\n%s", tc.env, tc.args, got, tc.warn, log)
		}
	}

	p := Start(t, bin, env)
	port := p.Admin[strings.LastIndexByte(p.Admin, ':')+1:]
	for host, want := range map[string]int{
		"127.0.0.1:" + port:        http.StatusOK,
		"localhost:" + port:        http.StatusOK,
		"[::1]:" + port:            http.StatusOK,
		"rebind.example:" + port:   http.StatusForbidden,
		"127.0.0.1.nip.io:" + port: http.StatusForbidden,
	} {
		for _, path := range []string{"/healthz", "/metrics"} {
			req, err := http.NewRequest(http.MethodGet, p.Admin+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			resp, err := do(http.DefaultClient, req)
			if err != nil || resp.Status != want {
				t.Errorf("admin %s with Host %q: %d %v, want %d", path, host, resp.Status, err, want)
			}
		}
	}
	p.Stop(t)
}

// startupLog runs bin with "-addr 127.0.0.1:0" and args (its admin address
// is theirs or its environment's) and an environment of only PATH plus
// env, until it logs that it listens or exits, and then stops it. It
// returns what the service logged; it never connects to the service.
func startupLog(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log strings.Builder
	timeout := time.After(startTimeout)
	for stopped := false; ; {
		select {
		case line, ok := <-lines:
			if !ok {
				cmd.Wait()
				return log.String()
			}
			log.WriteString(line + "\n")
			if !stopped && listening.MatchString(line) {
				cmd.Process.Signal(syscall.SIGTERM)
				stopped = true
			}
		case <-timeout:
			cmd.Process.Kill()
			timeout = nil
		}
	}
}
