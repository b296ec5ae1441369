package ceiling

import (
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// A rule counting bytes can ask for a limit past what a Structured Field
// integer holds (15 digits: a petabyte a day is 16), and a unit of any
// length. The limiter takes what the headers can say (the limit up to
// backend.MaxLimit, a unit up to the 1024 characters a Structured Field
// parser must support, RFC 9651 §3.3.3) and refuses the rest, so that
// every header it sends parses.
func TestUnitAndQuotaAtTheSFBounds_Attack(t *testing.T) {
	for _, r := range []Rule{
		{Name: "bytes", Key: Static("s"), Limit: backend.MaxLimit, Period: 24 * time.Hour, Unit: "content-bytes"},
		{Name: "bytes", Key: Static("s"), Limit: backend.MaxLimit + 1, Period: 24 * time.Hour, Unit: "content-bytes"},
		{Name: "bytes", Key: Static("s"), Limit: 1_000_000_000_000_000, Period: 24 * time.Hour, Unit: "content-bytes"},
		{Name: "bytes", Key: Static("s"), Limit: 10, Period: time.Minute, Unit: "u" + strings.Repeat("a", 1023)},
		{Name: "bytes", Key: Static("s"), Limit: 10, Period: time.Minute, Unit: "u" + strings.Repeat("a", 1024)},
	} {
		l, err := New([]Rule{r}, WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			if len(r.Unit) <= 1024 && r.Limit <= backend.MaxLimit {
				t.Errorf("limit %d, unit of %d bytes refused: %v", r.Limit, len(r.Unit), err)
			}
			continue // refused: nothing is sent
		}
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		l.Close()
		for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
			v := w.Header().Get(name)
			if _, err := parseSFList(v); err != nil {
				t.Errorf("limit %d, unit of %d bytes: %s %.80q... is no Structured Field: %v", r.Limit, len(r.Unit), name, v, err)
				continue
			}
			if name == "RateLimit-Policy" && len(r.Unit) > 1024 {
				t.Errorf("unit of %d bytes sent in RateLimit-Policy: past the 1024 characters a parser must support", len(r.Unit))
			}
		}
	}
}
