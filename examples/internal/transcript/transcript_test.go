package transcript

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ceiling-go/ceiling/examples/internal/servicetest"
)

func TestParse(t *testing.T) {
	md := "# A README\n\n" +
		"```sh\n$ not run\nnot output\n```\n\n" +
		"```\n$ nor this\n```\n" +
		"```console\n" +
		"$ export A=1\n" +
		"$ curl -s localhost:8080/a \\\n" +
		"    -d x\n" +
		"{\"ok\":true}\n" +
		"$ for i in 1 2; do\n" +
		">   echo \\\n" +
		">     $i\n" +
		"> done\n" +
		"1\n" +
		"2\n" +
		"```\n" +
		"prose\n" +
		"~~~~ console\n$ echo [..]\n...\n~~~~\n"
	got, err := Parse(md)
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{
		{Line: 12, Text: "export A=1"},
		{Line: 13, Text: "curl -s localhost:8080/a \\\n    -d x", Want: `{"ok":true}`},
		{Line: 16, Text: "for i in 1 2; do\n  echo \\\n    $i\ndone", Want: "1\n2"},
		{Line: 25, Text: "echo [..]", Want: "..."},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Parse:\n%+v\nwant\n%+v", got, want)
	}
}

func TestParseRefusesBrokenSessions(t *testing.T) {
	for name, md := range map[string]string{
		"unclosed block":          "```console\n$ echo\n",
		"output before commands":  "```console\nhello\n$ echo\n```\n",
		"output of another block": "```console\n$ echo a\na\n```\n\n```console\nb\n```\n",
		"dangling continuation":   "```console\n$ echo \\\n```\n",
	} {
		if _, err := Parse(md); err == nil {
			t.Errorf("%s: Parse accepted\n%s", name, md)
		}
	}
}

func TestMatch(t *testing.T) {
	response := "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 12\r\nContent-Type: application/problem+json\r\n" +
		"Date: Mon, 02 Jan 2026 15:04:05 GMT\r\nRatelimit: \"a\";r=0;t=900\r\nRetry-After: 900\r\n\r\n{\"status\":429}\n"
	for _, tc := range []struct {
		name, want, got string
		ok              bool
	}{
		{"same", "a\nb", "a\nb\n", true},
		{"spaces around lines", "30 200\n30 429", "     30 200\n     30 429\n", true},
		{"a line differs", "30 200\n30 429", "29 200\n31 429\n", false},
		{"a line more", "a", "a\nb\n", false},
		{"a line less", "a\nb", "a\n", false},
		{"nothing shown, something printed", "", "a\n", false},
		{"[..] in a line", `t=[..], r=[..];`, "t=64307, r=2;", true},
		{"[..] keeps the rest", `t=[..], r=2`, "t=64307, r=3", false},
		{"... takes lines", "a\n...\nd", "a\nb\nc\nd", true},
		{"... takes none", "a\n...\nd", "a\nd", true},
		{"... at the end", "a\n...", "a\nb\nc", true},
		{"... keeps what follows", "a\n...\nd", "a\nb\nc", false},
		{"response: the fields shown", "HTTP/1.1 429 Too Many Requests\nContent-Type: application/problem+json\nRetry-After: 900\n\n{\"status\":429}", response, true},
		{"response: [..] in a field", "HTTP/1.1 429 Too Many Requests\nRatelimit: \"a\";r=0;t=[..]\n\n{\"status\":429}", response, true},
		{"response: another status", "HTTP/1.1 200 OK\n\n{\"status\":429}", response, false},
		{"response: a field differs", "HTTP/1.1 429 Too Many Requests\nRetry-After: 899\n\n{\"status\":429}", response, false},
		{"response: a field missing", "HTTP/1.1 429 Too Many Requests\nWww-Authenticate: Bearer\n\n{\"status\":429}", response, false},
		{"response: the body differs", "HTTP/1.1 429 Too Many Requests\n\n{\"status\":200}", response, false},
	} {
		if err := Match(tc.want, tc.got); (err == nil) != tc.ok {
			t.Errorf("%s: Match(%q, %q) = %v, want ok %v", tc.name, tc.want, tc.got, err, tc.ok)
		}
	}
}

// The stand-in prints, byte for byte, what curl prints for the options
// READMEs use, on the same server (where curl is installed).
func TestCurlStandInPrintsWhatCurlPrints(t *testing.T) {
	real, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed: nothing to compare the stand-in with")
	}
	standIn, err := servicetest.Build(t.TempDir(), "github.com/ceiling-go/ceiling/examples/internal/transcript/curl")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Echo what curl sent, so that the request is compared too.
		w.Header().Set("Ratelimit", `"a";r=1;t=60`)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/refuse" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		body := make([]byte, 1024)
		n, _ := r.Body.Read(body)
		fmt.Fprintf(w, "%s %s ct=%q auth=%q accept=%q ae=%q body=%q\n", r.Method, r.URL, r.Header.Get("Content-Type"),
			r.Header.Get("Authorization"), r.Header.Get("Accept"), r.Header.Get("Accept-Encoding"), body[:n])
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, args := range [][]string{
		{"-s", host + "/a"},
		{"-si", "-X", "POST", "-d", `{"phone": "+254 700 000 000"}`, host + "/refuse"},
		{"-s", "-i", "-H", "Authorization: Bearer t0k", "-H", "Content-Type: application/json", "-d", "a=1", "-d", "b=2", srv.URL + "/x?q=1"},
		{"-s", "-o", "/dev/null", "-w", `%{http_code}\n`, "-X", "POST", host + "/refuse"},
		{"-sS", "-w", "%{http_code} ", host + "/"},
	} {
		want, err := exec.Command(real, args...).Output()
		if err != nil {
			t.Fatalf("curl %q: %v", args, err)
		}
		got, err := exec.Command(standIn, args...).Output()
		if err != nil {
			t.Fatalf("stand-in %q: %v", args, err)
		}
		// Only what curl and the stand-in cannot agree on: the date, and
		// the version curl puts in User-Agent (not echoed here).
		if g, w := dropDate(string(got)), dropDate(string(want)); g != w {
			t.Errorf("curl %q:\nthe stand-in printed\n%q\ncurl printed\n%q", args, g, w)
		}
	}
}

func dropDate(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(line, "Date: ") {
			b.WriteString(line)
		}
	}
	return b.String()
}
