// Package ceiling is rate-limit middleware for net/http (and chi, Echo and
// Gin) whose limit is a ceiling, not a speed bump: the number written in
// the code is the number enforced, on one process or on fifty, and when it
// cannot be enforced, somebody is told.
//
//	limiter := ceiling.MustNew([]ceiling.Rule{
//		{Name: "otp:phone", Key: ceiling.Must(ceiling.BodyField("phone")), Limit: 3, Period: 15 * time.Minute},
//		{Name: "otp:ip", Key: ceiling.RemoteAddr, Limit: 20, Period: 15 * time.Minute},
//	})
//	defer limiter.Close()
//	mux.Handle("POST /otp", limiter.Handler(sendOTP)) // 429 with Retry-After past a limit
//
// A [Rule] is one limit on one dimension of a request: at most Limit units
// per Period for each value of its Key. The key function ([KeyFunc]) says
// whom the rule stops, and there is no default: [RemoteAddr] or [ClientIP]
// for the client address, [JWTClaim] with "sub" for a verified account,
// [BodyField] for the destination of an SMS, [Route], [Static] for
// everybody at once. (A rule decided only by [Limiter.Decide], as the gRPC
// adapter's are, has no key function: its callers pass the key value.)
//
// A Limiter keeps a goroutine until [Limiter.Close]: close every limiter
// you build.
//
// The algorithm says how a rule counts. The zero value, [RollingWindow],
// never admits more than Limit in any rolling Period, with bounded state
// per key; [SlidingLog] also gives each unit back exactly one Period after
// it was taken, at the price of one entry per unit (small limits only);
// [GCRA] is a smooth rate with a burst; [SlidingWindow] and [FixedWindow]
// are cheaper and can admit more around window edges (backend/ALGORITHMS.md
// has the arithmetic).
//
// Every request is decided by one call to the backend covering every rule
// that applies to it, all or nothing: a request that any rule rejects
// consumes from no rule. The default backend is this process's memory
// (package backend/memory), exact for one process; package backend/redis
// shares the limits between instances.
//
// When the backend cannot decide in time ([WithTimeout], 100ms by default),
// each rule's fail mode does: [FailLocal], the default, enforces each rule
// on the instance's own memory at its share of the limit; [FailOpen] admits;
// [FailClosed] answers 503. Either way the degradation is logged once,
// counted, passed to the [Observer] and shown by [Limiter.HealthHandler].
package ceiling
