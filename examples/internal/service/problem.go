package service

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/ceiling-go/ceiling"
)

// Problem writes an RFC 9457 problem body for the service's own errors
// (a bad request, a failed dependency), with the headers ceiling's own
// 429 and 503 bodies carry.
func Problem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(ceiling.Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(body)
}
