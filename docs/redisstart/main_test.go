package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

const secret = "0123456789abcdef0123456789abcdef"

// start runs setUp against redisURL, closing what it opened at the end.
func start(t *testing.T, redisURL string) (http.Handler, error) {
	t.Helper()
	t.Setenv("REDIS_URL", redisURL)
	t.Setenv("KEY_SECRET", secret)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, closeAll, err := setUp(ctx)
	if err == nil {
		t.Cleanup(closeAll)
	}
	return h, err
}

func get(h http.Handler, path string) int {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	return w.Code
}

// On a healthy Redis the program limits: 3 answers, then 429.
func TestSetUpLimitsOnRedis(t *testing.T) {
	h, err := start(t, "redis://"+redistest.Server(t).Addr+"/0")
	if err != nil {
		t.Fatal(err)
	}
	var codes []int
	for range 4 {
		codes = append(codes, get(h, "/hello"))
	}
	if want := []int{200, 200, 200, 429}; !equal(codes, want) {
		t.Errorf("GET /hello 4 times: %v, want %v", codes, want)
	}
	if c := get(h, "/healthz"); c != http.StatusOK {
		t.Errorf("/healthz = %d on a healthy Redis", c)
	}
}

// A misconfiguration refuses to start, naming its kind: a wrong password
// will not fix itself. So does a URL that is not one.
func TestSetUpRefusesAMisconfiguredRedis(t *testing.T) {
	srv := redistest.ServerWith(t, "requirepass s3cret")
	_, err := start(t, "redis://"+srv.Addr+"/0")
	if !errors.Is(err, backend.ErrAuth) {
		t.Errorf("setUp without the password = %v, want an error wrapping backend.ErrAuth", err)
	}
	if _, err := start(t, "redis://"+srv.Addr+",127.0.0.1:1/0"); err == nil || !strings.Contains(err.Error(), "redis+cluster://") {
		t.Errorf("setUp with two hosts in a redis:// URL = %v, want the error naming redis+cluster://", err)
	}
	if _, err := start(t, "redis://:s3cret@"+srv.Addr+"/0"); err != nil {
		t.Errorf("setUp with the password: %v", err)
	}
}

// An unreachable Redis is an outage, not a misconfiguration: the program
// starts degraded, and /healthz says so.
func TestSetUpStartsDegradedOnAnUnreachableRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	h, err := start(t, "redis://"+addr+"/0")
	if err != nil {
		t.Fatalf("setUp on an unreachable Redis refused to start: %v", err)
	}
	if c := get(h, "/healthz"); c != http.StatusServiceUnavailable {
		t.Errorf("/healthz = %d on an unreachable Redis, want 503", c)
	}
	if c := get(h, "/hello"); c != http.StatusOK {
		t.Errorf("GET /hello = %d while degraded, want 200 (FailLocal)", c)
	}
}

// The README's Redis section shows setUp as this file has it, byte for
// byte, so that the snippet is the tested program.
func TestREADMERedisSectionIsSetUp(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, fn, ok := strings.Cut(string(program), "\n// setUp ")
	if !ok {
		t.Fatal("main.go has no setUp")
	}
	fn = "// setUp " + fn
	if !strings.Contains(string(readme), "\n```go\n"+fn+"```\n") {
		t.Errorf("README.md has no go block that is docs/redisstart's setUp:\n%s", fn)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
