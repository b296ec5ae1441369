package backend

import "errors"

// Kinds of backend failure. A backend wraps its errors with one of these
// (fmt.Errorf("%w: ...: %w", backend.ErrReadOnly, err)) so that the
// limiter's health report and metrics can say what kind of failure it is
// without repeating the error's text, which may name addresses, keys or
// credentials. An error wrapping none of them is reported as a plain
// "error"; the limiter's own timeout is reported as "timeout".
var (
	// ErrUnreachable: no connection could be made or kept (refused, reset,
	// no route, a dial that timed out).
	ErrUnreachable = errors.New("backend unreachable")
	// ErrAuth: the backend refused the credentials, or asked for some.
	ErrAuth = errors.New("backend refused authentication")
	// ErrReadOnly: the backend is a replica or otherwise refuses writes.
	ErrReadOnly = errors.New("backend is read-only")
	// ErrOutOfMemory: the backend is full and refuses writes.
	ErrOutOfMemory = errors.New("backend out of memory")
)

// ErrNotSent is wrapped by the error of a call the backend never wrote to
// its server: the deadline passed before this process got to send it (a
// goroutine waiting for a CPU, every connection busy). Nothing of it
// reached the server, so it may be sent again, and it says nothing about
// the server's health (see [Backend]).
var ErrNotSent = errors.New("backend call never sent")

// ErrUnread is wrapped by the error of a call the backend wrote but whose
// reply this process was too busy to read by the deadline (its goroutine
// waited for a CPU while the reply may well have come). Like [ErrNotSent]
// it says nothing about the server's health; unlike it, the call may have
// been applied, so it must not be sent again unless it is idempotent.
var ErrUnread = errors.New("backend reply not read: this process was too busy")
