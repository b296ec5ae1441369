// Package servicetest tests the example services as they run in production:
// it builds a service's real binary, starts it on a free loopback port,
// waits for it, sends requests (one at a time or many at once) and stops it
// with SIGTERM, checking that it exits cleanly.
package servicetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Build compiles the main package pkg (an import path) into dir and returns
// the binary's path. It runs in the caller's module, so under the
// repository's go.work it builds the working tree's code.
func Build(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// A Binary is a main package built at most once per test binary, on first
// use, into a temporary directory that [Binary.Remove] deletes.
type Binary struct {
	// Pkg is the main package's import path.
	Pkg string

	once      sync.Once
	dir, path string
	err       error
}

// Path builds the package the first time it is called and returns the
// executable's path; a build failure fails t.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", filepath.Base(b.Pkg)+"-bin-")
		if b.err == nil {
			b.path, b.err = Build(b.dir, b.Pkg)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Remove deletes what Path built; call it from TestMain after m.Run.
func (b *Binary) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// startTimeout bounds how long a started service may take to listen and
// answer /healthz; stopTimeout how long it may take to exit after SIGTERM.
const (
	startTimeout = 10 * time.Second
	stopTimeout  = 10 * time.Second
)

// A Process is one running service binary.
type Process struct {
	// URL is the service's base URL, "http://127.0.0.1:port".
	URL string
	// Admin is the base URL of its admin listener (GET /healthz, GET
	// /metrics).
	Admin string

	cmd    *exec.Cmd
	log    *syncBuffer
	exited chan struct{}
	err    error // cmd.Wait's, valid once exited is closed
}

var listening = regexp.MustCompile(`msg=listening addr=(\S+) admin=(\S+)`)

// Start runs bin with "-addr 127.0.0.1:0 -admin 127.0.0.1:0" (free ports
// that the service logs), args and an environment of only PATH plus env,
// so that nothing of the test's own environment (a REDIS_URL) leaks in. It
// returns once the service answers GET /healthz on its admin listener with
// any status, and kills it when the test ends if it still runs.
func Start(t testing.TB, bin string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{log: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0"}, args...)...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	addr := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.log.WriteString(line + "\n")
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1:]:
				default:
				}
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	select {
	case a := <-addr:
		p.URL, p.Admin = "http://"+a[0], "http://"+a[1]
	case <-p.exited:
		t.Fatalf("%s exited before listening: %v\n%s", bin, p.err, p.Log())
	case <-time.After(startTimeout):
		t.Fatalf("%s did not log its address within %v\n%s", bin, startTimeout, p.Log())
	}
	if !Eventually(startTimeout, func() bool {
		resp, err := http.Get(p.Admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}) {
		t.Fatalf("%s did not answer /healthz within %v\n%s", bin, startTimeout, p.Log())
	}
	return p
}

// Stop sends SIGTERM and fails the test unless the service exits with
// status 0 within stopTimeout: a graceful shutdown.
func (p *Process) Stop(t testing.TB) {
	t.Helper()
	// A graceful shutdown waits for connections the client opened and has
	// not used yet; closing the default client's idle ones keeps it quick.
	http.DefaultClient.CloseIdleConnections()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("the service did not exit within %v of SIGTERM\n%s", stopTimeout, p.Log())
	}
	if p.err != nil {
		t.Fatalf("the service exited with %v after SIGTERM\n%s", p.err, p.Log())
	}
}

// Log returns what the service has logged so far.
func (p *Process) Log() string { return p.log.String() }

// syncBuffer is a bytes.Buffer safe for one writer and many readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.WriteString(s)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// LogBuffer is a place for a service's slog output in tests, safe for
// simultaneous writes; read it with String.
type LogBuffer struct{ syncBuffer }

// Token signs claims with secret (HS256), adding an expiry an hour ahead
// unless claims has one; an "exp" of nil means a token without expiry.
func Token(t testing.TB, secret string, claims jwt.MapClaims) string {
	t.Helper()
	if exp, ok := claims["exp"]; !ok {
		claims["exp"] = time.Now().Add(time.Hour).Unix()
	} else if exp == nil {
		delete(claims, "exp")
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// A Response is what a request got back.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Post sends a POST with a JSON body and, when token is not empty, a
// bearer token. header adds header fields ("X-Forwarded-For: ...").
func Post(client *http.Client, url, token, body string, header ...string) (Response, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for _, h := range header {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(k, strings.TrimSpace(v))
	}
	return do(client, req)
}

// Get sends a GET.
func Get(client *http.Client, url string) (Response, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return Response{}, err
	}
	return do(client, req)
}

func do(client *http.Client, req *http.Request) (Response, error) {
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

// Parallel calls fn(i) for i in [0, n), at most width at a time, and
// returns how many calls got each status. An error counts as status 0 and
// is returned (the first one).
func Parallel(n, width int, fn func(i int) (int, error)) (map[int]int, error) {
	var (
		mu       sync.Mutex
		counts   = map[int]int{}
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, width)
	)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			status, err := fn(i)
			mu.Lock()
			defer mu.Unlock()
			counts[status]++
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	return counts, firstErr
}

// Eventually polls cond every 10ms until it holds or timeout passes, and
// reports whether it held. Use it to wait for something to happen (a window
// to reopen, a server to come back), never to assert how long it took.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// AdminOnly fails t unless p serves GET /healthz and GET /metrics on its
// admin listener and answers 404 for them on its public one: the health
// report says when the limits are off, and the metrics count each rule's
// traffic, which is nobody's business but the operator's.
func AdminOnly(t testing.TB, p *Process) {
	t.Helper()
	for path, want := range map[string]string{"/healthz": `"status":`, "/metrics": "ceiling_rate_limiting_degraded "} {
		if resp, err := Get(http.DefaultClient, p.URL+path); err != nil || resp.Status != http.StatusNotFound {
			t.Errorf("public %s: %d %v, want 404", path, resp.Status, err)
		}
		if resp, err := Get(http.DefaultClient, p.Admin+path); err != nil || resp.Status != http.StatusOK || !strings.Contains(resp.Body, want) {
			t.Errorf("admin %s: %d %v, want 200 with %q:\n%.300s", path, resp.Status, err, want, resp.Body)
		}
	}
}
