package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// slotGroups returns the indices of reqs grouped by Cluster hash slot, in
// order of first appearance and request order within a group; nil without
// Cluster or when every key shares a slot.
func (s *Store) slotGroups(reqs []backend.Request) [][]int {
	if s.cluster == nil || len(reqs) < 2 {
		return nil
	}
	first := slot(s.prefix + reqs[0].Key)
	same := true
	slots := make([]uint16, len(reqs))
	for i, r := range reqs {
		slots[i] = slot(s.prefix + r.Key)
		same = same && slots[i] == first
	}
	if same {
		return nil
	}
	var groups [][]int
	index := map[uint16]int{}
	for i, sl := range slots {
		g, ok := index[sl]
		if !ok {
			g = len(groups)
			index[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// decideSlots decides a call whose keys span several slots: one script
// per slot, pipelined per node. If any slot rejects (or fails), the slots
// that consumed are refunded, so the call is all or nothing; until the
// refund lands the limiter may briefly under-admit, never over-admit.
func (s *Store) decideSlots(ctx context.Context, reqs []backend.Request, groups [][]int) ([]backend.Result, bool, error) {
	keys := make([][]string, len(groups))
	sub := make([][]backend.Request, len(groups))
	for g, idx := range groups {
		for _, i := range idx {
			keys[g] = append(keys[g], s.prefix+reqs[i].Key)
			sub[g] = append(sub[g], reqs[i])
		}
	}
	replies, errs := s.runGroups(ctx, keys, sub, true, false)

	res := make([]backend.Result, len(reqs))
	rejected := false
	var firstErr error
	for g := range groups {
		if errs[g] != nil {
			if firstErr == nil {
				firstErr = errs[g]
			}
			continue
		}
		rejected = rejected || replies[g].rejected
	}
	for g, idx := range groups {
		if errs[g] != nil {
			continue
		}
		for j, i := range idx {
			res[i] = replies[g].results[j]
			if rejected {
				// nothing of the call stays consumed
				res[i] = replies[g].peeks[j]
			}
		}
	}
	if rejected || firstErr != nil {
		s.refund(ctx, keys, sub, replies, errs)
	}
	if firstErr != nil {
		return nil, false, firstErr
	}
	return res, rejected, nil
}

// refund undoes what the groups of a rejected (or failed) cross-slot call
// wrote: each key still as the call left it gets back its value and TTL
// (decideScript's "u" mode), each lease its expiry and units. A key
// another client wrote meanwhile is inverted instead: each admitted charge
// refunded with its admission's stamp, so only those units come back (an
// acquisition releases its lease, a renewal stays), and an undone refund is
// charged again. GCRA gives back only what is still outstanding. It runs on
// its own deadline even when ctx is done. A request with a Once goes with
// its key: put back, its once entry is put back as it was (a ticket the
// call wrote or consumed, a record it wrote), so that a resend of the
// settlement applies and a ticket that stood before the call still
// stands. On a key another client wrote, an undone reservation is
// refunded with its Once, consuming the ticket it wrote but not one that
// stood before it (unless a settlement of the call consumed that one),
// and a forced charge's record it replaced (one before the call or the
// call's own) is written again; a settlement stays applied, so that a
// repeat is a no-op. Of several reservations of one Once on one key only
// the last inverse carries it: the call wrote one ticket, which the first
// would consume, leaving the others' units taken.
func (s *Store) refund(ctx context.Context, keys [][]string, sub [][]backend.Request, replies []reply, errs []error) {
	var ukeys [][]string
	var uargs [][]any
	var ugroups []int
	var entries [][]int // per undo group, per request: its entry in ukeys, -1 none
	for g := range sub {
		if errs[g] != nil || replies[g].rejected {
			continue
		}
		var k []string
		var a []any
		entry := make([]int, len(sub[g]))
		for j, u := range replies[g].undo {
			entry[j] = -1
			if at := slices.Index(k, keys[g][j]); at >= 0 {
				entry[j] = at
				continue
			}
			if u.action == 0 {
				continue
			}
			entry[j] = len(k)
			k = append(k, keys[g][j])
			a = append(a, u.action, u.value, u.old, u.ttl, appliedOnces(sub[g], keys[g], replies[g], keys[g][j]))
		}
		if len(k) > 0 {
			ukeys, uargs, ugroups, entries = append(ukeys, k), append(uargs, a), append(ugroups, g), append(entries, entry)
		}
	}
	if len(ukeys) == 0 {
		return
	}
	restored := s.restore(ctx, ukeys, uargs)

	var rkeys [][]string
	var rreqs [][]backend.Request
	for i, g := range ugroups {
		if restored[i] == nil {
			// a failed undo leaves units consumed until their keys expire
			continue
		}
		var k []string
		var rs []backend.Request
		// settled: the (key, once) of the group's settlements that stay
		// applied, whose ticket the call consumed; last: the last
		// reservation of the group that names each (key, once), whose
		// inverse alone may consume a ticket (the call writes one per pair).
		type pair struct {
			key  string
			once int64
		}
		// charged: those whose applied settlements include a forced
		// charge, whose record the inverse of a reservation must leave.
		settled, charged, last := map[pair]bool{}, map[pair]bool{}, map[pair]int{}
		for j, r := range sub[g] {
			if r.Once == 0 {
				continue
			}
			p := pair{keys[g][j], r.Once}
			if r.Cost > 0 && !r.Force {
				last[p] = j
			} else if replies[g].added[j] {
				settled[p] = true
				charged[p] = charged[p] || r.Cost > 0
			}
		}
		for j, r := range sub[g] {
			res := replies[g].results[j]
			at := entries[i][j]
			p := pair{keys[g][j], r.Once}
			switch {
			case at < 0 || restored[i][at] == 1 || r.Cost == 0 || !res.Allowed:
				continue // put back, untouched, or never consumed (a shadow request that did not fit)
			case r.Algorithm == backend.Concurrency && r.Cost > 0 && !replies[g].added[j]:
				continue // a renewal
			case r.Once != 0 && (r.Cost < 0 || r.Force):
				continue // a settlement applied: a repeat finds its ticket gone or its record
			}
			r.Stamp = res.Stamp
			if r.Cost < 0 {
				r.Stamp = 0
			}
			if strings.HasPrefix(replies[g].undo[j].once, "-") && !settled[p] {
				r.Once = 0 // a resent reservation: its ticket stood before the call, and stands
			}
			if r.Once != 0 && last[p] != j {
				r.Once = 0 // a twin: the last inverse of the pair consumes the one ticket
			}
			r.Cost, r.Force = -r.Cost, true
			k, rs = append(k, keys[g][j]), append(rs, r)
			if u := replies[g].undo[j].once; r.Once != 0 && (u != "" && u[0] != '-' || charged[p]) {
				// The call's reservation replaced a forced charge's record (one
				// before the call, or the call's own) with its ticket, which the
				// inverse consumes: a forced request of no units with the Once
				// writes the record again (decide.lua), so that the charge's
				// resend stays a no-op.
				keep := r
				keep.Cost, keep.Stamp = 0, 0
				k, rs = append(k, keys[g][j]), append(rs, keep)
			}
		}
		if len(rs) > 0 {
			rkeys, rreqs = append(rkeys, k), append(rreqs, rs)
		}
	}
	if len(rreqs) > 0 {
		s.runGroups(ctx, rkeys, rreqs, false, true) // detached: a refund must land
	}
}

// appliedOnces lists, space-separated as "once=value,PTTL" (or "once="
// when absent), the once entries as they were before the call of every
// request in reqs (stored under keys) on key that the call applied, which
// the undo of key puts back with it.
func appliedOnces(reqs []backend.Request, keys []string, rep reply, key string) string {
	var b strings.Builder
	for j, r := range reqs {
		if r.Once != 0 && rep.added[j] && keys[j] == key {
			fmt.Fprintf(&b, "%d=%s ", r.Once, rep.undo[j].once)
		}
	}
	return b.String()
}

// restore runs decideScript's "u" mode once per group, detached like a
// refund, and returns per group which entries it put back (nil: no reply).
func (s *Store) restore(ctx context.Context, keys [][]string, args [][]any) [][]int64 {
	w, ops := newWaiter(ctx, len(keys))
	for g := range keys {
		head := s.args(nil, false)[:2] // the clock and minimum TTL
		ops[g] = s.scriptOp(ctx, decideScript, keys[g], append(append(head, "u"), args[g]...))
	}
	err := s.call(ctx, w, ops, true)
	out := make([][]int64, len(keys))
	for g := range keys {
		if err != nil {
			break
		}
		if v, e := ops[g].cmd.Int64Slice(); e == nil && len(v) == len(keys[g]) {
			out[g] = v
		}
	}
	w.release(err == nil)
	return out
}

// undoFields is how many values per request decideScript adds with peeks.
const undoFields = 5

// keyUndo is a key (or lease) as a cross-slot script found and left it.
type keyUndo struct {
	old    string // the value before, "" when absent (leases: see decide.lua)
	ttl    any    // its PTTL before, ms ("" for leases)
	action int64  // 0 untouched, 1 set, 2 deleted, 3 leases changed
	value  string // the value left
	once   string // its once entry before, "value,PTTL" ("" when absent)
}

// decodeUndo reads the undo fields of a decide script's reply.
func decodeUndo(arr []any) ([]keyUndo, error) {
	out := make([]keyUndo, len(arr)/undoFields)
	for i := range out {
		f := arr[undoFields*i : undoFields*(i+1)]
		old, ok1 := f[0].(string)
		action, ok3 := f[2].(int64)
		value, ok4 := f[3].(string)
		once, ok5 := f[4].(string)
		_, ok2 := f[1].(int64)
		if s, ok := f[1].(string); ok && action != 1 && action != 2 {
			ok2, f[1] = true, s // ""  for leases
		}
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return nil, fmt.Errorf("%w: undo fields of request %d are %T, %T, %T, %T, %T", errReply, i, f[0], f[1], f[2], f[3], f[4])
		}
		out[i] = keyUndo{old: old, ttl: f[1], action: action, value: value, once: once}
	}
	return out, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// slot is key's Cluster hash slot: CRC16 of the key, or of its hash tag
// (between the first '{' and the next '}', when not empty), mod 16384.
func slot(key string) uint16 {
	if start := strings.IndexByte(key, '{'); start >= 0 {
		if end := strings.IndexByte(key[start+1:], '}'); end > 0 {
			key = key[start+1 : start+1+end]
		}
	}
	return crc16(key) & 16383
}

// crc16 is CRC-16/XMODEM, the Cluster specification's key checksum.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
