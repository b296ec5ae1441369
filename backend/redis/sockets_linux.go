package redis

import (
	"syscall"
	"unsafe"
)

// exactSockets: the kernel tells the bytes waiting on a socket (FIONREAD,
// alias TIOCINQ), so calls out of budget are judged by their sockets.
const exactSockets = true

// unreadBytes returns the bytes waiting to be read on the socket fd, or -1.
func unreadBytes(fd uintptr) int {
	var n int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); errno != 0 {
		return -1
	}
	return int(n)
}
