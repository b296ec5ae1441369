package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
	"github.com/ceiling-go/ceiling/internal/citest"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// The overload test's shape (issue 30.2): three chat instances, 100 shops
// per window spread over them, a fixed offered rate above what the shared
// 2-core machine sustains, and a CPU hog beside them.
const (
	overloadShops   = 100
	overloadWindows = 3
	overloadWindow  = 15 * time.Second // three fit in one rolling minute of a shop's limit
	overloadRate    = 2500             // requests per second offered, whatever comes back
	overloadFlight  = 600              // requests in flight at most; the rest are counted unsent
	pingBound       = 10 * time.Millisecond
)

// An overloaded instance is not a Redis outage (issue 30): three chat
// binaries (FailOpen, the production 100 ms timeout and breaker) on one
// healthy redis-server and on a 3-master Cluster are offered 2500 requests a
// second, more than this machine serves, over 100 fresh shops per 15 s
// window, while a CPU hog burns every core beside them. Each shop is
// admitted at most its 30 per minute in every window and no instance
// admits anything by its fail mode (ceiling_rate_limiting_fail_mode_admissions_total stays
// 0), as long as Redis answers PING within 10 ms throughout: what the
// overloaded instances cannot decide in time they shed, 503 with
// Retry-After. Then Redis is frozen (SIGSTOP) under the same load and the
// fail mode still applies within the timeout.
//
// PING is measured by a child process (this test binary re-executed) that
// runs, like Redis, under SCHED_FIFO where the test may set it (root), so
// that neither the hog nor the instances starve Redis or the measurement;
// the monitor also reports its own timer lag, so that a late sample can be
// told from a slow Redis.
func TestOverloadShedsAndNeverFailsOpen(t *testing.T) {
	citest.Only(t)
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Server(t)
		o := startOverload(t, "redis://"+srv.Addr+"/0", []string{srv.Addr}, []int{srv.PID()})
		o.windows(t)
		o.freeze(t, srv)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		var pids []int
		for _, a := range c.Addrs() {
			pids = append(pids, c.Node(a).PID())
		}
		o := startOverload(t, "redis+cluster://"+strings.Join(c.Addrs(), ","), c.Addrs(), pids)
		o.windows(t)
	})
}

// overload is one run: the instances, the hog and the PING monitor.
type overload struct {
	procs  []*servicetest.Process
	ping   *pingMonitor
	client *http.Client
}

func startOverload(t *testing.T, redisURL string, addrs []string, redisPIDs []int) *overload {
	o := &overload{
		client: &http.Client{
			Transport: &http.Transport{MaxIdleConnsPerHost: overloadFlight, MaxConnsPerHost: overloadFlight},
			Timeout:   10 * time.Second,
		},
	}
	t.Cleanup(o.client.CloseIdleConnections)
	env := []string{"REDIS_URL=" + redisURL, "CHAT_JWT_SECRET=" + testSecret, "KEY_SECRET=" + strings.Repeat("k", 32),
		"TRUSTED_PROXIES=127.0.0.0/8", "INSTANCES=3"}
	bin := chatBinary.Path(t)
	for range 3 {
		o.procs = append(o.procs, servicetest.Start(t, bin, env))
	}
	// Each instance starts healthy: a start-up Check that timed out on
	// this loaded machine leaves an instance degraded until a probe
	// answers, which is not what this test measures.
	for i, p := range o.procs {
		if !servicetest.Eventually(10*time.Second, func() bool {
			r, err := servicetest.Get(o.client, p.Admin+"/healthz")
			return err == nil && r.Status == 200
		}) {
			t.Fatalf("instance %d not healthy 10 s after its start:\n%s", i, p.Log())
		}
	}
	o.ping = startPing(t, addrs, redisPIDs)
	startHog(t)
	return o
}

// windows offers the load for overloadWindows windows, each with its own
// 100 shops, and checks every shop's admissions per window, the fail-mode
// admissions and Redis's PING latency.
func (o *overload) windows(t *testing.T) {
	run := redistest.KeyPrefix(t)
	var all []sample
	for w := range overloadWindows {
		shops := make([]string, overloadShops)
		for i := range shops {
			shops[i] = token(t, fmt.Sprintf("https://w%d-%d-%s.myshopify.com", w, i, run))
		}
		got := o.offer(shops, overloadWindow)
		all = append(all, got...)
		admitted := make([]int, len(shops))
		for _, s := range got {
			if s.status == 200 {
				admitted[s.shop]++
			}
		}
		if m := slices.Max(admitted); m > 30 {
			t.Errorf("window %d: a shop was admitted %d times, over its 30 per minute (per shop: %v)", w, m, admitted)
		}
		t.Logf("window %d: %s; admitted per shop %d–%d", w, summary(got), slices.Min(admitted), slices.Max(admitted))
	}
	ping := o.ping.report()
	open, shed, transitions := o.scrape(t)
	t.Logf("all windows: %s; instances: %d fail-mode rule admissions, %d shed (overloaded), %d transitions; Redis PING: %s",
		summary(all), open, shed, transitions, ping)
	// The promise holds while Redis answers PING within 10 ms; it is
	// asserted whatever PING measured, which is stronger, and a slower
	// PING (on a machine shared with other work even a real-time monitor
	// can be late) is reported.
	if ping.max > pingBound {
		t.Logf("Redis answered PING in %v at worst (the monitor's own timer was up to %v late), over %v", ping.max, ping.lag, pingBound)
	}
	if open != 0 || transitions != 0 {
		t.Errorf("%d fail-mode admissions and %d degraded transitions on a healthy Redis: the instances blamed Redis for their own overload", open, transitions)
		for i, p := range o.procs {
			t.Logf("instance %d: %s", i, grepLines(p.Log(), "fail modes applied", "backend degraded"))
		}
	}
}

// freeze stops Redis under the same load: every instance's fail mode
// (open) applies, each fail-mode answer within the timeout of its call's
// write and the breaker's opening soon after.
func (o *overload) freeze(t *testing.T, srv *redistest.Instance) {
	run := redistest.KeyPrefix(t)
	shops := make([]string, overloadShops)
	for i := range shops {
		shops[i] = token(t, fmt.Sprintf("https://frozen-%d-%s.myshopify.com", i, run))
	}
	before, _, _ := o.scrape(t)
	srv.Freeze(t)
	frozen := time.Now()
	defer srv.Thaw(t)
	got := o.offer(shops, 6*time.Second)
	after, _, transitions := o.scrape(t)
	first := time.Duration(-1)
	for _, s := range got {
		if s.status == 200 && (first < 0 || s.sent.Add(s.took).Sub(frozen) < first) {
			first = s.sent.Add(s.took).Sub(frozen)
		}
	}
	t.Logf("frozen: %s; %d fail-mode rule admissions (a request has five rules), %d transitions; first admission %v after the freeze", summary(got), after-before, transitions, first)
	if after == before || transitions < 3 {
		t.Errorf("frozen Redis: %d fail-mode admissions and %d transitions over the three instances, want the fail mode applied and each degraded", after-before, transitions)
	}
	// The breaker's own bound: five calls that each waited the 100 ms
	// timeout after their write, on a machine this loaded.
	if first < 0 || first > 5*time.Second {
		t.Errorf("the fail mode first admitted %v after the freeze, want within seconds", first)
	}
}

// A sample is one offered request: its shop, when it was sent, how long
// it took and its status (0: a transport error; -1: never sent, the
// generator's in-flight bound was reached).
type sample struct {
	shop   int
	sent   time.Time
	took   time.Duration
	status int
}

// offer sends overloadRate requests a second for d, open loop: each tick
// starts one request, to instance i%3, of shop i%len(shops), from address
// i%4096 behind the trusted proxy, unless overloadFlight are in flight.
func (o *overload) offer(shops []string, d time.Duration) []sample {
	n := int(d.Seconds() * overloadRate)
	out := make([]sample, n)
	var (
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * time.Second / overloadRate)
		if w := time.Until(due); w > 0 {
			time.Sleep(w) // the generator's own pacing, real time
		}
		s := &out[i]
		s.shop, s.sent = i%len(shops), time.Now()
		if inFlight.Load() >= overloadFlight {
			s.status = -1
			continue
		}
		inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			r, err := servicetest.Post(o.client, o.procs[i%len(o.procs)].URL+"/api/chat", shops[s.shop], question,
				"X-Forwarded-For: 10."+strconv.Itoa(i%4096/256)+"."+strconv.Itoa(i%256)+".1")
			s.took = time.Since(s.sent)
			if err == nil {
				s.status = r.Status
			}
		}()
	}
	wg.Wait()
	return out
}

// summary is the statuses and the latency percentiles of samples.
func summary(samples []sample) string {
	statuses := map[int]int{}
	var took []time.Duration
	for _, s := range samples {
		statuses[s.status]++
		if s.status > 0 {
			took = append(took, s.took)
		}
	}
	slices.Sort(took)
	pct := func(p float64) time.Duration {
		if len(took) == 0 {
			return 0
		}
		return took[int(p*float64(len(took)-1))].Round(time.Millisecond)
	}
	served := len(took)
	return fmt.Sprintf("%d offered, %d answered (%v; -1 unsent, 0 transport error), p50 %v p99 %v",
		len(samples), served, statuses, pct(0.50), pct(0.99))
}

var (
	failOpenLine   = regexp.MustCompile(`(?m)^ceiling_rate_limiting_fail_mode_admissions_total\{[^}]*\} (\d+)`)
	overloadedLine = regexp.MustCompile(`(?m)^ceiling_rate_limiting_backend_errors_total\{error_type="overloaded"\} (\d+)`)
	transitionLine = regexp.MustCompile(`(?m)^ceiling_rate_limiting_degraded_transitions_total (\d+)`)
)

// scrape sums the instances' fail-mode admissions, shed calls and
// degraded transitions from their /metrics.
func (o *overload) scrape(t *testing.T) (open, shed, transitions int) {
	t.Helper()
	sum := func(re *regexp.Regexp, body string) (n int) {
		for _, m := range re.FindAllStringSubmatch(body, -1) {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
		return n
	}
	for _, p := range o.procs {
		r, err := servicetest.Get(o.client, p.Admin+"/metrics")
		if err != nil || r.Status != 200 {
			t.Fatalf("/metrics: %d %v", r.Status, err)
		}
		open += sum(failOpenLine, r.Body)
		shed += sum(overloadedLine, r.Body)
		transitions += sum(transitionLine, r.Body)
	}
	return open, shed, transitions
}

// grepLines returns the lines of s that contain any of subs.
func grepLines(s string, subs ...string) string {
	var out []string
	for line := range strings.Lines(s) {
		if servicetest.ContainsAny(line, subs) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// The helper processes: the test binary re-executed with one of these in
// its environment runs TestOverloadHelper as that process and nothing else.
const (
	hogEnv  = "CHAT_OVERLOAD_HOG"  // burn every core until killed
	pingEnv = "CHAT_OVERLOAD_PING" // PING these comma-separated addresses, reporting on stdout
	// helperLife bounds a helper that outlives its test (a killed go test).
	helperLife = 5 * time.Minute
)

// TestOverloadHelper is not a test: it is the body of the hog and PING
// helper processes, and returns at once in a normal run.
func TestOverloadHelper(t *testing.T) {
	switch {
	case os.Getenv(hogEnv) != "":
		for range runtime.NumCPU() * 2 {
			go func() {
				for x := uint64(1); ; x = x*6364136223846793005 + 1 {
				}
			}()
		}
		time.Sleep(helperLife) // bounded; the test kills it sooner
		os.Exit(0)
	case os.Getenv(pingEnv) != "":
		pingHelper(strings.Split(os.Getenv(pingEnv), ","))
		os.Exit(0)
	}
}

// helper starts this test binary as a helper process with env, killed
// when the test ends; realtime runs it under SCHED_FIFO (chrt).
func helper(env string, realtime bool) *exec.Cmd {
	args := []string{os.Args[0], "-test.run=^TestOverloadHelper$", "-test.count=1"}
	if realtime {
		args = append([]string{"chrt", "-f", rtPriority}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env)
	return cmd
}

func startHog(t *testing.T) {
	cmd := helper(hogEnv+"=1", false)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

// rtPriority is the SCHED_FIFO priority that the PING helper and Redis run
// at where this process may set it (root, with chrt installed): above
// every ordinary process, the hog, the instances and the other work of a
// shared machine, so that neither Redis nor its measurement is starved and
// a late PING means a slow Redis, not a late monitor. Neither spins: each
// sleeps between its commands.
const rtPriority = "10"

// realtime moves every thread of the processes pids to SCHED_FIFO and
// reports whether it could.
func realtime(pids []int) bool {
	if _, err := exec.LookPath("chrt"); err != nil || os.Geteuid() != 0 {
		return false
	}
	for _, pid := range pids {
		if exec.Command("chrt", "-f", "-a", "-p", rtPriority, strconv.Itoa(pid)).Run() != nil {
			return false
		}
	}
	return true
}

// pingHelper PINGs every address every 5 ms, each on its own connection,
// and prints one line per second: "ping <max µs> <samples> <max lag µs>",
// where lag is how late its own timer fired (a measure of its own
// starvation, not Redis's).
func pingHelper(addrs []string) {
	conns := make([]*bufio.ReadWriter, len(addrs))
	for i, a := range addrs {
		c, err := net.Dial("tcp", a)
		if err != nil {
			fmt.Println("error", err)
			return
		}
		conns[i] = bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	}
	var worst, lag time.Duration
	samples := 0
	report := time.Now().Add(time.Second)
	end := time.Now().Add(helperLife)
	next := time.Now()
	for time.Now().Before(end) {
		next = next.Add(5 * time.Millisecond)
		time.Sleep(time.Until(next))
		lag = max(lag, time.Since(next))
		for _, c := range conns {
			start := time.Now()
			c.WriteString("PING\r\n")
			c.Flush()
			if line, err := c.ReadString('\n'); err != nil || line != "+PONG\r\n" {
				fmt.Println("error", line, err)
				return
			}
			worst = max(worst, time.Since(start))
			samples++
		}
		if time.Now().After(report) {
			fmt.Printf("ping %d %d %d\n", worst.Microseconds(), samples, lag.Microseconds())
			worst, lag, samples, report = 0, 0, 0, report.Add(time.Second)
			next = time.Now()
		}
	}
}

// A pingMonitor is a running PING helper and what it reported.
type pingMonitor struct {
	mu       sync.Mutex
	worst    []time.Duration // per second
	lag      time.Duration
	samples  int
	realtime bool
	errs     []string
}

type pingReport struct {
	max, p99, lag time.Duration
	samples       int
	realtime      bool
}

func (p pingReport) String() string {
	return fmt.Sprintf("%d PINGs, worst second's max %v, 99th percentile of the seconds' max %v, monitor lag at worst %v, Redis and monitor real-time %v",
		p.samples, p.max, p.p99, p.lag, p.realtime)
}

func startPing(t *testing.T, addrs []string, pids []int) *pingMonitor {
	rt := realtime(pids)
	cmd := helper(pingEnv+"="+strings.Join(addrs, ","), rt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &pingMonitor{realtime: rt}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			m.mu.Lock()
			switch {
			case len(f) == 4 && f[0] == "ping":
				us, _ := strconv.Atoi(f[1])
				n, _ := strconv.Atoi(f[2])
				lag, _ := strconv.Atoi(f[3])
				m.worst = append(m.worst, time.Duration(us)*time.Microsecond)
				m.samples += n
				m.lag = max(m.lag, time.Duration(lag)*time.Microsecond)
			case len(f) > 0 && f[0] == "error":
				m.errs = append(m.errs, sc.Text())
			}
			m.mu.Unlock()
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cmd.Wait()
	})
	return m
}

// report is what the monitor measured since it started or since the
// last report, which it forgets, so that a freeze that follows is not
// counted.
func (m *pingMonitor) report() pingReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := slices.Clone(m.worst)
	slices.Sort(w)
	r := pingReport{lag: m.lag, samples: m.samples, realtime: m.realtime}
	if len(w) > 0 {
		r.max, r.p99 = w[len(w)-1], w[int(0.99*float64(len(w)-1))]
	}
	if len(m.errs) > 0 {
		r.max = time.Hour // an error is no answer
	}
	m.worst = nil
	return r
}
