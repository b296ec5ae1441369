//go:build unix

package ceiling_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ceiling-go/ceiling"
)

// The OTP limit comes from a file an operator edits during an attack;
// SIGHUP reloads it. ceiling does not watch files: the program reads the
// file, keeps what it read in an atomic.Pointer (for its own handlers
// and logs), and hands the limit to SetLimit, which swaps it under the
// requests in flight. A file that does not parse, or a limit New would
// refuse, keeps the limit in force.
func ExampleLimiter_SetLimit() {
	dir, _ := os.MkdirTemp("", "ceiling")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "otp-limit")
	os.WriteFile(path, []byte("5\n"), 0o600)

	l := ceiling.MustNew([]ceiling.Rule{{Name: "otp", Algorithm: ceiling.SlidingLog, Limit: 5, Period: 15 * time.Minute}})
	defer l.Close()

	var current atomic.Pointer[int64]
	reload := func() {
		b, err := os.ReadFile(path)
		if err != nil {
			fmt.Println("reload:", err)
			return
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil {
			err = l.SetLimit("otp", n, 0)
		}
		if err != nil {
			fmt.Println("reload: keeping", *current.Load(), "per 15 minutes:", err)
			return
		}
		current.Store(&n)
		fmt.Println("otp limit:", n, "per 15 minutes")
	}
	reload()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloaded := make(chan struct{})
	go func() {
		for range hup {
			reload()
			reloaded <- struct{}{}
		}
	}()

	send := func() bool {
		d, _ := l.Decide(context.Background(), ceiling.Input{Rule: "otp", Key: "+15550001111"})
		return d.Allowed
	}
	fmt.Println(send(), send(), send())

	// Under attack: the operator lowers the limit and sends SIGHUP.
	os.WriteFile(path, []byte("2\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	<-reloaded
	fmt.Println(send())

	os.WriteFile(path, []byte("lots\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	<-reloaded
	// Output:
	// otp limit: 5 per 15 minutes
	// true true true
	// otp limit: 2 per 15 minutes
	// false
	// reload: keeping 2 per 15 minutes: strconv.ParseInt: parsing "lots": invalid syntax
}
