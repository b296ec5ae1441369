// Package transcript makes the shell sessions in READMEs test fixtures: a
// test runs each session against the real binaries and fails when what a
// README shows differs from what the programs print.
//
// # The format
//
// A README's session is every fenced code block whose info string is
// "console", in order, run in one shell (sh) as a reader following the
// README in one terminal would: variables exported by one command and
// servers started in the background by another are there for the next.
// Blocks of any other kind ("sh", "go") are not run.
//
//   - A line starting with "$ " is a command. Lines starting with "> ", and
//     the line after one ending in "\", continue it.
//   - The lines up to the next command are what the command prints on
//     standard output. Standard error is not compared, and every command
//     must exit with status 0.
//   - Lines are compared without their leading and trailing spaces (uniq -c
//     pads differently on different systems).
//   - "[..]" in a line matches any text within that line: a date, a token,
//     a time that depends on the clock.
//   - A line "..." matches any number of lines, including none.
//   - An HTTP response (curl -i) shows only the header fields that matter:
//     its status line and every field shown must be there as shown; fields
//     not shown (Date, Content-Length) are not compared.
//
// # What the test changes
//
// Before a command runs, the test points it at what it started:
// "go run ./examples/otp" (any key of [Config.Binaries]) becomes the binary
// the test built; the ports 8080 to 8099 and 9090 to 9099 become free
// loopback ports (ADDR and PORT name the one that stands for 8080, and
// ADMIN_ADDR the one for 9090, so that a service started without -addr and
// -admin listens there); redis://127.0.0.1:6379 and
// redis://localhost:6379 become a redis-server of the test's own, started
// when a command first names it (so a session's commands before that run
// without redis-server, and the rest skips). curl is a stand-in (package
// transcript/curl) that sends the request and prints exactly what curl
// prints for the options READMEs use (-s, -S, -i, -X, -d, -H, -o, -w
// '%{http_code}'), so that sessions run where curl is not installed; it
// refuses any other option.
package transcript

import (
	"bufio"
	"fmt"
	"strings"
)

// A Command is one command of a session and the output the README shows
// for it.
type Command struct {
	// Line is the README line of the command's "$ ".
	Line int
	// Text is the command as the shell gets it: continuation lines joined
	// by newlines, prompts removed.
	Text string
	// Want is the output shown, one line per line, without a trailing
	// newline; empty when the README shows none.
	Want string
}

// Parse returns the commands of markdown's console blocks, in order. An
// unterminated block, output before any command, or a command left
// unfinished by a trailing "\" is an error naming the line.
func Parse(markdown string) ([]Command, error) {
	var (
		cmds    []Command
		inBlock bool
		tested  bool
		fence   string
		open    = -1 // index of the command still taking continuation lines
		out     []string
	)
	flush := func() {
		if len(cmds) > 0 && out != nil {
			cmds[len(cmds)-1].Want = strings.Join(out, "\n")
		}
		out = nil
	}
	sc := bufio.NewScanner(strings.NewReader(markdown))
	sc.Buffer(nil, 1<<20)
	n := 0
	blockStart := 0
	for sc.Scan() {
		n++
		line := strings.TrimSuffix(sc.Text(), "\r")
		trimmed := strings.TrimLeft(line, " ")
		if !inBlock {
			if f, info, ok := fenceOpen(trimmed); ok {
				inBlock, fence, blockStart = true, f, n
				f := strings.Fields(info)
				tested = len(f) > 0 && f[0] == "console"
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			if tested {
				if open >= 0 {
					return nil, fmt.Errorf("line %d: the command ends in \\ but the block ends", n)
				}
				flush()
			}
			inBlock = false
			continue
		}
		if !tested {
			continue
		}
		switch {
		case open >= 0:
			cmds[open].Text += "\n" + strings.TrimPrefix(line, "> ")
			if !strings.HasSuffix(line, `\`) {
				open = -1
			}
		case strings.HasPrefix(line, "$ "):
			flush()
			cmds = append(cmds, Command{Line: n, Text: line[2:]})
			if strings.HasSuffix(line, `\`) {
				open = len(cmds) - 1
			}
		case strings.HasPrefix(line, "> ") && len(cmds) > 0 && len(out) == 0:
			c := &cmds[len(cmds)-1]
			c.Text += "\n" + line[2:]
			if strings.HasSuffix(line, `\`) {
				open = len(cmds) - 1
			}
		default:
			if len(cmds) == 0 || cmds[len(cmds)-1].Line < blockStart {
				return nil, fmt.Errorf("line %d: output %q before any command of the console block opened on line %d", n, line, blockStart)
			}
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if inBlock {
		return nil, fmt.Errorf("line %d: the code block is not closed", blockStart)
	}
	return cmds, nil
}

// fenceOpen reports whether line opens a fenced code block, returning its
// fence ("```" or "~~~", possibly longer) and info string.
func fenceOpen(line string) (fence, info string, ok bool) {
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(line, c+c+c) {
			i := 0
			for i < len(line) && line[i] == c[0] {
				i++
			}
			return line[:i], strings.TrimSpace(line[i:]), true
		}
	}
	return "", "", false
}
