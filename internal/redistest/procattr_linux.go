package redistest

import "syscall"

// sysProcAttr makes the kernel kill a server when the test binary dies
// without running its cleanups (a panic, a timeout, a kill), so no
// redis-server outlives its tests. (Strictly, Pdeathsig fires when the OS
// thread that started the server ends; the Go runtime ends a thread only
// when a goroutine locked to it returns, which test code does not do.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
