// Package pgtest starts private PostgreSQL servers for tests (this module's
// and the bench module's; it is test support, not part of the backend): initdb into a
// temporary directory, then postgres on a free loopback port with its unix
// socket in that directory, fsync off, and a password login for one
// superuser. A server is a child of the test binary (the kernel kills it if
// the binary dies) and is stopped when its test, or for [Shared] the test
// binary, ends. Never the system's cluster.
//
// Without initdb and postgres (on PATH or in /usr/lib/postgresql/*/bin)
// the helpers skip the test and say how to run it, unless
// CEILING_REQUIRE_POSTGRES=1 is set (CI sets it), which makes the skip a
// failure.
//
// initdb and postgres refuse to run as root: when the test binary is root,
// they run as the "postgres" user (or "nobody") through the process
// credentials, in a directory that user owns.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RequireEnv turns missing PostgreSQL binaries into a failure.
const RequireEnv = "CEILING_REQUIRE_POSTGRES"

// User and Password are the superuser every server is created with.
const (
	User     = "ceiling"
	Password = "ceiling-test"
)

// startTimeout bounds how long a server may take to accept a login.
const startTimeout = 30 * time.Second

// bins finds initdb and postgres, or says why not.
func bins() (initdb, postgres string, err error) {
	dirs := []string{""}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(m) > 0 {
		for i := len(m) - 1; i >= 0; i-- {
			dirs = append(dirs, m[i])
		}
	}
	for _, d := range dirs {
		i, e1 := look(d, "initdb")
		p, e2 := look(d, "postgres")
		if e1 == nil && e2 == nil {
			return i, p, nil
		}
		if err == nil {
			err = errors.Join(e1, e2)
		}
	}
	return "", "", err
}

func look(dir, name string) (string, error) {
	if dir == "" {
		return exec.LookPath(name)
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

// Require skips tb (fails it under RequireEnv) when PostgreSQL is missing.
func Require(tb testing.TB) (initdb, postgres string) {
	tb.Helper()
	i, p, err := bins()
	if err == nil {
		return i, p
	}
	msg := fmt.Sprintf("pgtest: initdb and postgres not found on PATH nor in /usr/lib/postgresql/*/bin (%v); "+
		"install PostgreSQL 15 or newer (for example `apt-get install postgresql`) to run the Postgres tests; "+
		"set %s=1 to make this a failure instead of a skip", err, RequireEnv)
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
	return "", ""
}

// Server is one postgres process on a loopback port. Its methods are safe
// for simultaneous use; the port stays the same across [Server.Restart].
type Server struct {
	Port int
	dir  string
	bin  string
	args []string
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	dbs  atomic.Int64
}

// Options change how a server is started.
type Options struct {
	// Settings are extra "name=value" server settings (-c).
	Settings []string
}

// Start starts a server for tb, stopped when tb ends.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := start(tb, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

var shared struct {
	mu  sync.Mutex
	s   *Server
	err error
}

// Shared returns the server this test binary shares, started on first use
// (with o, if given) and stopped by [Main] or [StopShared]. Tests keep
// apart with [Server.Database].
func Shared(tb testing.TB, o ...Options) *Server {
	tb.Helper()
	Require(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.s == nil && shared.err == nil {
		var opts Options
		if len(o) > 0 {
			opts = o[0]
		}
		shared.s, shared.err = start(tb, opts)
	}
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.s
}

// Main runs the tests and stops the shared server:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	StopShared()
	return code
}

// StopShared stops the shared server, if one was started: for a TestMain
// that already runs its tests through another package's Main.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.s != nil {
		shared.s.Close()
		shared.s = nil
	}
}

func start(tb testing.TB, o Options) (*Server, error) {
	initdb, bin := Require(tb)
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ceiling-pg-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{dir: dir, bin: bin, cred: cred}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(Password+"\n"), 0o600); err == nil && cred != nil {
		err = os.Chown(pw, int(cred.Uid), int(cred.Gid))
	}
	init := exec.Command(initdb, "-D", s.data(), "-U", User, "--pwfile", pw, "-A", "scram-sha-256",
		"--no-sync", "-E", "UTF8", "--locale", "C")
	init.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	init.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := init.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	s.args = []string{"-D", s.data(), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "deadlock_timeout=50ms",
		"-c", "shared_preload_libraries=pg_stat_statements", "-c", "log_min_messages=fatal"}
	for _, kv := range o.Settings {
		s.args = append(s.args, "-c", kv)
	}
	if err := s.listen(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Standby starts a hot standby of primary for tb (pg_basebackup -R),
// stopped when tb ends: it answers reads and refuses writes, and
// pg_is_in_recovery() is true on it.
func Standby(tb testing.TB, primary *Server) *Server {
	tb.Helper()
	s, err := standby(primary)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

func standby(primary *Server) (*Server, error) {
	dir, err := os.MkdirTemp("", "ceiling-pg-")
	if err != nil {
		return nil, err
	}
	if c := primary.cred; c != nil {
		if err := os.Chown(dir, int(c.Uid), int(c.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{dir: dir, bin: primary.bin, cred: primary.cred}
	bin, err := basebackup(primary.bin)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	backup := exec.Command(bin, "-D", s.data(), "-R",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", User, "--no-sync")
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	backup.Env = append(os.Environ(), "PGPASSWORD="+Password)
	if out, err := backup.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	s.args = append([]string{}, primary.args...)
	for i, a := range s.args {
		switch {
		case a == primary.data():
			s.args[i] = s.data()
		case a == primary.dir:
			s.args[i] = dir
		}
	}
	if err := s.listen(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// listen runs the server on a free loopback port, trying up to five: a
// port found free can be taken before the server binds it.
func (s *Server) listen() error {
	var err error
	for range 5 {
		if s.Port, err = freePort(); err == nil {
			if err = s.run(); err == nil {
				return nil
			}
		}
	}
	return err
}

// basebackup finds pg_basebackup beside postgres (a symbolic link on PATH
// leads to the installation's directory) or on PATH.
func basebackup(postgres string) (string, error) {
	if real, err := filepath.EvalSymlinks(postgres); err == nil {
		if p := filepath.Join(filepath.Dir(real), "pg_basebackup"); fileExists(p) {
			return p, nil
		}
	}
	return exec.LookPath("pg_basebackup")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// credential is whom initdb and postgres run as: nil (the test's user)
// unless that is root, which both refuse.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgtest: running as root and no postgres or nobody user to run postgres as")
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run starts postgres and waits until it accepts a login.
func (s *Server) run() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lastErr error
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		cmd := exec.Command(s.bin, append(s.args, "-p", strconv.Itoa(s.Port))...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
		logf, err := os.Create(filepath.Join(s.dir, "log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return err
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		for time.Now().Before(deadline) {
			select {
			case <-done:
				out, _ := os.ReadFile(filepath.Join(s.dir, "log"))
				lastErr = fmt.Errorf("pgtest: postgres exited: %s", out)
			case <-time.After(20 * time.Millisecond):
				lastErr = s.ping()
				if lastErr == nil {
					s.cmd, s.done = cmd, done
					return nil
				}
				continue
			}
			break
		}
		if strings.Contains(lastErr.Error(), "could not bind") || strings.Contains(lastErr.Error(), "Address already in use") {
			return lastErr // another port
		}
		// Backends of a killed postmaster may still hold its shared memory.
		time.Sleep(100 * time.Millisecond)
	}
	return lastErr
}

func (s *Server) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// URL is the connection URL of database db, logged in as [User].
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", User, Password, s.Port, db)
}

// Database creates a fresh database on s and returns its URL.
func (s *Server) Database(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	return s.URL(name)
}

// Pool opens a pool on url for tb, closed when tb ends.
func Pool(tb testing.TB, url string, edit ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range edit {
		e(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// PID is the postmaster's process id.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// Signal sends sig to the postmaster and its children (each backend is a
// session leader of its own, so no process group holds them all). For
// SIGKILL the postmaster is stopped first, so that it cannot start
// recovery or fork while its children die.
func (s *Server) Signal(sig syscall.Signal) error {
	pid := s.PID()
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	if sig == syscall.SIGCONT {
		_ = syscall.Kill(pid, sig)
	}
	for _, c := range children(pid) {
		_ = syscall.Kill(c, sig)
	}
	return syscall.Kill(pid, sig)
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// Kill kills the server at once, backends included, and waits for it.
func (s *Server) Kill() {
	_ = s.Signal(syscall.SIGKILL)
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	<-done
}

// Restart stops the server (a fast shutdown: sessions are cut, nothing
// committed is lost) and starts it again on the same port and data.
func (s *Server) Restart() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGINT)
	<-done
	return s.run()
}

// Crash stops the server as a crash would (an immediate shutdown: no
// checkpoint, and WAL still in the server's buffers is lost) and starts
// it again on the same port and data, which replays the WAL that reached
// the files.
func (s *Server) Crash() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	<-done
	return s.run()
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd != nil {
		_ = s.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.Signal(syscall.SIGKILL)
			<-done
		}
	}
	os.RemoveAll(s.dir)
}
