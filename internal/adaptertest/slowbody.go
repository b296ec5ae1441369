package adaptertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// SlowBody checks that [ceiling.BodyField]'s own read-time bound holds
// through mount: a client that sends its JSON body a byte every 50 ms, to a
// server without ReadTimeout, is answered 408 by the limiter while it is
// still sending. The bound is a read deadline set through
// http.ResponseController, which reaches the connection only if the
// framework's ResponseWriter unwraps (Unwrap() http.ResponseWriter) to
// net/http's; one that does not leaves the body unbounded, and the request
// is admitted once the last byte arrives.
func SlowBody(t *testing.T, mount Mount) {
	t.Helper()
	const bound = 300 * time.Millisecond
	l := ceiling.MustNew([]ceiling.Rule{{Name: "otp:phone", Key: ceiling.Must(ceiling.BodyField("phone", ceiling.BodyTimeout(bound))),
		Limit: 100, Period: time.Minute}}, ceiling.WithBackend(&Counter{}))
	srv := httptest.NewServer(mount(l, Handler, "/otp")) // no ReadTimeout: the key function must bound itself
	defer srv.Close()
	defer l.Close()

	// 200 bytes at 50 ms each take 10 s: far past the bound, however busy
	// the machine.
	body := `{"phone": "+254700000000", "pad": "` + strings.Repeat("x", 200) + `"}`
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second)) // a hung server fails the test, not the run
	fmt.Fprintf(conn, "POST /otp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	var sent atomic.Bool // the whole body went out
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range len(body) {
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
			if i == len(body)-1 {
				sent.Store(true)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	finished := sent.Load()
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || finished {
		t.Errorf("a body slower than BodyTimeout(%v): %d %s (answered after the whole body was sent: %v); "+
			"want 408 while the client is still sending: the read deadline did not reach the connection", bound, resp.StatusCode, got, finished)
	}
}
