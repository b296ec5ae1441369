//go:build !linux

package redistest

import "syscall"

// sysProcAttr is nil where the kernel cannot tie a child's life to its
// parent's: the cleanups alone stop the servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
