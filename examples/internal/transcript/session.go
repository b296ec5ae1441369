package transcript

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// Config says what a README's session runs against.
type Config struct {
	// Binaries maps a command as the README writes it ("go run
	// ./examples/otp") to the main package the test builds and runs in its
	// place.
	Binaries map[string]*servicetest.Binary
	// Env is added to the session's environment ("NAME=value"): settings
	// a reader's machine does not need but a test machine, shared and
	// loaded, does.
	Env []string
}

// Timeouts: a command may take commandTimeout (a loop of requests on a
// loaded machine); a service started in the background must listen within
// listenTimeout; the session's processes must exit within stopTimeout of
// SIGTERM.
const (
	commandTimeout = 60 * time.Second
	listenTimeout  = 30 * time.Second
	stopTimeout    = 10 * time.Second
)

// Test runs the session of the README at path (relative to the test's
// directory, "README.md") and fails t at the first command whose output
// or exit status is not what the README shows. A command that names Redis
// skips the rest of the session without redis-server, as redistest does;
// one that runs a program the machine lacks (exit status 127) skips it too,
// unless CEILING_REQUIRE_REDIS=1, which CI sets.
func Test(t *testing.T, path string, cfg Config) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("README sessions are sh sessions")
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := Parse(string(md))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(cmds) == 0 {
		t.Fatalf("%s has no console session", path)
	}
	bin := t.TempDir()
	if _, err := servicetest.Build(bin, "github.com/ceiling-go/ceiling/examples/internal/transcript/curl"); err != nil {
		t.Fatal(err)
	}
	rw, err := newRewriter(t, cmds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sh := startShell(t, append([]string{
		"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH") + string(os.PathListSeparator) + "/usr/local/bin:/usr/bin:/bin",
		"HOME=" + t.TempDir(),
		"ADDR=127.0.0.1:" + rw.ports["8080"],
		"PORT=" + rw.ports["8080"],
		"ADMIN_ADDR=127.0.0.1:" + rw.ports["9090"],
	}, cfg.Env...))
	for _, c := range cmds {
		where := fmt.Sprintf("%s:%d: $ %s", path, c.Line, c.Text)
		if rw.redis == "" && readmeRedis.MatchString(c.Text) {
			t.Logf("%s:%d: the session so far is as shown; from here on it uses Redis", path, c.Line)
		}
		text := rw.rewrite(t, c.Text)
		got, status, err := sh.run(text)
		if err != nil {
			t.Fatalf("%s\n%v\nstandard error:\n%s", where, err, sh.stderr.String())
		}
		if status == 127 {
			msg := fmt.Sprintf("%s\na program the session runs is not installed (exit status 127):\n%s", where, lastLines(sh.stderr.String(), 5))
			if os.Getenv(redistest.RequireEnv) == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		if status != 0 {
			t.Fatalf("%s\nexit status %d; output:\n%s\nstandard error:\n%s", where, status, got, sh.stderr.String())
		}
		if err := Match(c.Want, got); err != nil {
			t.Fatalf("%s\n%v\nThe README shows:\n%s\nThe command printed:\n%s", where, err, c.Want, got)
		}
		if strings.HasSuffix(strings.TrimSpace(c.Text), "&") {
			rw.waitListening(t, text, sh)
		}
	}
}

// A rewriter points a session's commands at what the test started.
type rewriter struct {
	binaries map[string]string // README command -> binary path
	order    []string          // binaries' keys, longest first
	ports    map[string]string // README port -> free port
	redis    string            // "redis://addr", once started
}

// sessionPorts are the ports a README may use for the services it starts:
// 8080 to 8099 for their public listeners, 9090 to 9099 for their admin
// ones.
var sessionPorts = regexp.MustCompile(`\b(80[89][0-9]|909[0-9])\b`)

// readmeRedis are the Redis URLs a README may use for a local server.
var readmeRedis = regexp.MustCompile(`redis://(127\.0\.0\.1|localhost):6379\b`)

func newRewriter(t *testing.T, cmds []Command, cfg Config) (*rewriter, error) {
	rw := &rewriter{binaries: map[string]string{}, ports: map[string]string{}}
	for cmd, b := range cfg.Binaries {
		rw.binaries[cmd] = b.Path(t)
		rw.order = append(rw.order, cmd)
	}
	// "go run ./examples/otp" must not be rewritten as a prefix of a longer key.
	sort.Slice(rw.order, func(i, j int) bool { return len(rw.order[i]) > len(rw.order[j]) })
	want := []string{"8080", "9090"}
	for _, c := range cmds {
		want = append(want, sessionPorts.FindAllString(c.Text, -1)...)
	}
	for _, p := range want {
		if rw.ports[p] != "" {
			continue
		}
		free, err := freePort()
		if err != nil {
			return nil, err
		}
		rw.ports[p] = free
	}
	return rw, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

func (rw *rewriter) rewrite(t *testing.T, cmd string) string {
	t.Helper()
	for _, k := range rw.order {
		// Whole commands only: "go run ." is not the start of "go run ./x".
		re := regexp.MustCompile(regexp.QuoteMeta(k) + `(\s|$|[;&|)])`)
		cmd = re.ReplaceAllStringFunc(cmd, func(m string) string { return rw.binaries[k] + m[len(k):] })
	}
	cmd = sessionPorts.ReplaceAllStringFunc(cmd, func(p string) string { return rw.ports[p] })
	if readmeRedis.MatchString(cmd) {
		if rw.redis == "" {
			rw.redis = "redis://" + redistest.Server(t).Addr
		}
		cmd = readmeRedis.ReplaceAllString(cmd, rw.redis)
	}
	return cmd
}

// waitListening waits until the services a background command started
// listen: on each free port the command names, else on the one that
// stands for 8080 (ADDR). A service binds its admin port before its public
// one, so the public one listening means both do.
func (rw *rewriter) waitListening(t *testing.T, cmd string, sh *shell) {
	t.Helper()
	var ports []string
	for _, p := range rw.ports {
		if regexp.MustCompile(`\b` + p + `\b`).MatchString(cmd) {
			ports = append(ports, p)
		}
	}
	if ports == nil {
		ports = []string{rw.ports["8080"]}
	}
	for _, p := range ports {
		ok := servicetest.Eventually(listenTimeout, func() bool {
			c, err := net.Dial("tcp", "127.0.0.1:"+p)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		if !ok {
			t.Fatalf("$ %s\nnothing listens on port %s after %v; standard error:\n%s", cmd, p, listenTimeout, sh.stderr.String())
		}
	}
}

// A shell is one sh process that runs commands in turn, as a terminal does.
type shell struct {
	cmd    *exec.Cmd
	stdin  *os.File
	out    chan string
	marker string
	stderr *servicetest.LogBuffer
	exited chan struct{}
	buf    string
}

func startShell(t *testing.T, env []string) *shell {
	t.Helper()
	var nonce [8]byte
	rand.Read(nonce[:])
	s := &shell{
		cmd:    exec.Command("sh"),
		out:    make(chan string, 64),
		marker: fmt.Sprintf("@@transcript-%x@@", nonce),
		stderr: &servicetest.LogBuffer{},
		exited: make(chan struct{}),
	}
	s.cmd.Env = env
	s.cmd.Dir = t.TempDir()
	s.cmd.Stderr = s.stderr
	// Its own process group, so that the services it starts in the
	// background are stopped with it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdin, s.cmd.Stdout, s.stdin = stdinR, stdoutW, stdinW
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting sh: %v", err)
	}
	stdinR.Close()
	stdoutW.Close()
	go func() {
		b := make([]byte, 32<<10)
		for {
			n, err := stdoutR.Read(b)
			if n > 0 {
				s.out <- string(b[:n])
			}
			if err != nil {
				close(s.out)
				stdoutR.Close()
				return
			}
		}
	}()
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// run runs one command and returns its standard output and exit status.
func (s *shell) run(cmd string) (string, int, error) {
	// Braces keep the command in this shell (its exports stay); /dev/null
	// keeps a command that reads standard input from reading the session.
	script := fmt.Sprintf("{\n%s\n} </dev/null\n__status=$?; printf '\\n%s %%d\\n' \"$__status\"\n", cmd, s.marker)
	if _, err := s.stdin.WriteString(script); err != nil {
		return "", 0, fmt.Errorf("writing to sh: %w", err)
	}
	end := regexp.MustCompile(`\n` + regexp.QuoteMeta(s.marker) + ` (\d+)\n`)
	deadline := time.After(commandTimeout)
	for {
		if m := end.FindStringSubmatchIndex(s.buf); m != nil {
			out := s.buf[:m[0]]
			status, _ := strconv.Atoi(s.buf[m[2]:m[3]])
			s.buf = s.buf[m[1]:]
			return out, status, nil
		}
		select {
		case chunk, ok := <-s.out:
			if !ok {
				return s.buf, 0, errors.New("sh exited")
			}
			s.buf += chunk
		case <-deadline:
			return s.buf, 0, fmt.Errorf("no end after %v", commandTimeout)
		}
	}
}

// stop ends the shell and everything it started: SIGTERM to its process
// group (services shut down gracefully), SIGKILL to what remains after
// stopTimeout. It returns once every process holding the session's
// standard output has exited.
func (s *shell) stop(t *testing.T) {
	s.stdin.Close()
	pgid := s.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	timeout := time.After(stopTimeout)
	for {
		select {
		case _, ok := <-s.out:
			if ok {
				continue
			}
			<-s.exited
			return
		case <-timeout:
			t.Errorf("the session's processes did not exit within %v of SIGTERM", stopTimeout)
			syscall.Kill(-pgid, syscall.SIGKILL)
			timeout = nil
		}
	}
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
