package check

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// slowPost sends a POST /api/otp to srv whose body stops after its
// first bytes, and returns the response the server writes meanwhile.
func slowPost(t *testing.T, srv *httptest.Server) response {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /api/otp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"phone\": \"+2547")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{req: httptest.NewRequest("POST", "http://localhost/api/otp", nil), status: resp.StatusCode, header: resp.Header, body: body}
}

// The middleware refuses a request whose key it cannot read from the body
// before any handler runs: 400 for a malformed body, 413 for one over its
// BodyLimit, 408 for one that does not arrive in time, each with a
// problem body. The document says it describes the responses ceiling's
// middleware sends, so an operation documented with its components must
// match these real responses as it matches the 429 and the 503.
func TestInputRefusalsMatchTheDocument_Attack(t *testing.T) {
	rt := router(t)
	phone := ceiling.Must(ceiling.BodyField("phone", ceiling.BodyLimit(64), ceiling.BodyTimeout(20*time.Millisecond)))
	limiter := ceiling.MustNew([]ceiling.Rule{
		{Name: "otp:phone", Key: phone, Limit: 3, Period: 15 * time.Minute, Algorithm: ceiling.SlidingLog, Hidden: true},
	}, quiet)
	defer limiter.Close()
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) }))
	post := func(body io.ReadCloser) response {
		r := httptest.NewRequest("POST", "http://localhost/api/otp", body)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return response{req: r, status: w.Code, header: w.Header(), body: w.Body.Bytes()}
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		resp   response
		status int
	}{
		{"a malformed body", post(io.NopCloser(strings.NewReader(`{"phone": `))), 400},
		{"a body over its limit", post(io.NopCloser(strings.NewReader(`{"phone": "` + strings.Repeat("1", 100) + `"}`))), 413},
		{"a body that does not arrive in time", slowPost(t, srv), 408},
	} {
		if tc.resp.status != tc.status {
			t.Fatalf("%s: status %d %s, want %d", tc.name, tc.resp.status, tc.resp.body, tc.status)
		}
		if err := validate(t, rt, tc.resp); err != nil {
			t.Errorf("%s: %d %v %s does not match the document: %v", tc.name, tc.resp.status, tc.resp.header, tc.resp.body, err)
		}
	}
}
