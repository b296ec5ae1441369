// Command curl is the stand-in for curl that README sessions run under
// package transcript: it sends the request curl would send for the options
// READMEs use and prints what curl prints, so that the sessions are tested
// where curl is not installed. Any other option is an error, so a README
// cannot come to depend on one the stand-in only pretends to know.
//
// Options: -s/--silent, -S/--show-error (no-ops: it prints no progress),
// -i/--include, -X/--request METHOD, -d/--data DATA (repeatable, joined by
// "&"; it makes the request a POST with Content-Type
// application/x-www-form-urlencoded unless -H sets one), -H/--header
// "Name: value", -o/--output FILE ("-" or /dev/null), -w/--write-out FORMAT
// (only %{http_code}, with \n, \t and \r escapes), and one URL, with or
// without "http://".
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// timeout bounds a request, so that a session never hangs on one.
const timeout = 30 * time.Second

type request struct {
	method   string
	data     []string
	headers  []string
	include  bool
	output   string
	writeOut string
	url      string
}

func main() {
	req, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "curl (transcript stand-in):", err)
		os.Exit(2)
	}
	if err := req.do(os.Stdout); err != nil {
		// curl's exit status 7: could not connect.
		fmt.Fprintln(os.Stderr, "curl (transcript stand-in):", err)
		os.Exit(7)
	}
}

func parse(args []string) (*request, error) {
	r := &request{}
	value := func(i *int, name string) (string, error) {
		*i++
		if *i >= len(args) {
			return "", fmt.Errorf("option %s needs a value", name)
		}
		return args[*i], nil
	}
	long := map[string]string{"--silent": "s", "--show-error": "S", "--include": "i", "--request": "X",
		"--data": "d", "--header": "H", "--output": "o", "--write-out": "w"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			if r.url != "" {
				return nil, fmt.Errorf("a second URL %q: the stand-in sends one request", a)
			}
			r.url = a
			continue
		}
		flags := a[1:]
		if strings.HasPrefix(a, "--") {
			short, ok := long[a]
			if !ok {
				return nil, fmt.Errorf("option %s is not one the stand-in knows", a)
			}
			flags = short
		}
		for j := 0; j < len(flags); j++ {
			f := flags[j]
			switch f {
			case 's', 'S':
			case 'i':
				r.include = true
			case 'X', 'd', 'H', 'o', 'w':
				v := flags[j+1:]
				if v == "" {
					var err error
					if v, err = value(&i, "-"+string(f)); err != nil {
						return nil, err
					}
				}
				j = len(flags)
				switch f {
				case 'X':
					r.method = v
				case 'd':
					r.data = append(r.data, v)
				case 'H':
					r.headers = append(r.headers, v)
				case 'o':
					r.output = v
				case 'w':
					r.writeOut = v
				}
			default:
				return nil, fmt.Errorf("option -%c is not one the stand-in knows", f)
			}
		}
	}
	if r.url == "" {
		return nil, errors.New("no URL")
	}
	if !strings.Contains(r.url, "://") {
		r.url = "http://" + r.url
	}
	if r.output != "" && r.output != "-" && r.output != os.DevNull {
		return nil, fmt.Errorf("-o %s: the stand-in writes only to - or %s", r.output, os.DevNull)
	}
	if strings.Contains(strings.ReplaceAll(r.writeOut, "%{http_code}", ""), "%{") {
		return nil, fmt.Errorf("-w %q: the stand-in knows only %%{http_code}", r.writeOut)
	}
	return r, nil
}

func (r *request) do(stdout io.Writer) error {
	method := r.method
	var body io.Reader
	if r.data != nil {
		body = strings.NewReader(strings.Join(r.data, "&"))
		if method == "" {
			method = http.MethodPost
		}
	}
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, r.url, body)
	if err != nil {
		return err
	}
	// What curl sends, except its version.
	req.Header.Set("User-Agent", "curl")
	req.Header.Set("Accept", "*/*")
	if r.data != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range r.headers {
		name, v, ok := strings.Cut(h, ":")
		if !ok {
			return fmt.Errorf("-H %q: want Name: value", h)
		}
		req.Header.Set(name, strings.TrimSpace(v))
	}
	client := &http.Client{
		Timeout: timeout,
		// curl asks for no compression without --compressed.
		Transport: &http.Transport{DisableCompression: true},
		// curl follows no redirect without -L.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var out io.Writer = w
	if r.output == os.DevNull {
		out = io.Discard
	}
	if r.include {
		writeHead(out, resp)
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		return err
	}
	if r.writeOut != "" {
		s := strings.ReplaceAll(r.writeOut, "%{http_code}", fmt.Sprintf("%03d", resp.StatusCode))
		s = strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\r`, "\r").Replace(s)
		io.WriteString(w, s)
	}
	return nil
}

// writeHead prints the status line and header fields as curl -i does for
// a Go server, which sends the handler's fields sorted by name, then Date
// and Content-Length (the Go client keeps neither the order nor the
// spelling of the names; Go's server writes them in canonical form, as
// printed here). A Content-Type the server sniffed, rather than the handler
// set, is printed among the handler's fields instead of after them.
func writeHead(w io.Writer, resp *http.Response) {
	fmt.Fprintf(w, "%s %s\r\n", resp.Proto, resp.Status)
	last := []string{"Date", "Content-Length"}
	names := make([]string, 0, len(resp.Header))
	for name := range resp.Header {
		if !slices.Contains(last, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range append(names, last...) {
		for _, v := range resp.Header[name] {
			fmt.Fprintf(w, "%s: %s\r\n", name, v)
		}
	}
	if slices.Contains(resp.TransferEncoding, "chunked") {
		fmt.Fprint(w, "Transfer-Encoding: chunked\r\n")
	}
	fmt.Fprint(w, "\r\n")
}
