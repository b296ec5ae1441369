-- The algorithms of ceiling's Redis backend, each written once, as
-- backend/ALGORITHMS.md gives them in whole µs: every value stays an integer
-- under 2^53, where doubles are exact, and floor division is corrected to
-- stay exact. It replaces the line "-- lib.lua" of batch.lua and decide.lua,
-- after the lines that set uses to the call's algorithms. A decision loads a
-- key's state, anchors it, decides over it in memory and stores it (ops).

local floor, max, min, sub, fmt, tonum = math.floor, math.max, math.min, string.sub, string.format, tonumber

-- Forced GCRA debt saturates 2^52 µs ahead, a window's count at 2^40.
local debtHorizon, countMax = 4503599627370496, 1099511627776

-- fdiv is floor(a / b) for integers a >= 0, b > 0, exact: the double
-- quotient can round up to the next integer when a/b is just below it.
local function fdiv(a, b)
  local q = floor(a / b)
  if q * b > a then return q - 1 elseif (q + 1) * b <= a then return q + 1 else return q end
end

local function cdiv(a, b) return fdiv(a + b - 1, b) end

local function serverTime() local t = redis.call('TIME') return tonum(t[1]) * 1000000 + tonum(t[2]) end

-- ops[alg] holds alg's functions, defined only when the call uses alg (a
-- script creates every function it defines on every run), over a key's
-- state s: load(key, raw, now, minTTL) parses it (raw: a one-string value,
-- '' when absent or of another layout); anchor(s, now, P) reads a clock
-- behind it (ALGORITHMS.md), reporting whether it did; decide(s, now, L, P,
-- B, c, force, x) (x: the lease id, or the stamp) returns allowed,
-- remaining, reset µs, retry µs (-1 never), next µs and the stamp
-- (Concurrency: 1 for a lease added); write(s, ttl, now, minTTL) is store's.
local ops = {}

-- The rolling window: "R2 W last S " (15 digits each), then the K+1 counts,
-- 10 digits and a space each, the current bucket's first.
local K, NMAX, RH, RW = 16, 4294967295, 51, 11
-- K zero counts, and a value whose older ones are 0 (literals: built, they cost every run).
local RZEROS = '0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 '
local RFRESH = 'R2 %015d %015d %015d %010d 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 '

if uses['0'] then
  -- rcount is count i (0..K, oldest first; < 0: one that left) of s in bucket b.
  local function rcount(s, b, i)
    local v = s.set[i]
    if v then return v end
    local d = b - s.rawLast
    if s.raw == nil or i + d > K or i + d < 0 then return 0 end
    local o = RH + (K - i - d) * RW
    return tonum(sub(s.raw, o + 1, o + 10)) or 0
  end

  -- rwait is when the buckets still counting hold at most x of S units.
  local function rwait(s, b, W, now, S, x)
    local acc = 0
    for i = 0, K do
      acc = acc + rcount(s, b, i)
      if S - acc <= x then return (b + i + 1) * W - now end
    end
    return (b + K + 1) * W - now -- a value whose sum disagrees with its counts
  end

  local function rafter(s, b, W, now, L, S)
    local reset = 0
    if S > 0 then
      local h = K
      while h > 0 and rcount(s, b, h) == 0 do h = h - 1 end
      reset = (b + h + 1) * W - now
    end
    return max(0, L - S), reset, S >= L and rwait(s, b, W, now, S, L - 1) or 0
  end

  local function rolling(s, now, L, P, _, c, force, stamp)
    local W = cdiv(P, K)
    if s.W ~= W and c == 0 then
      return 1, L, 0, 0, 0, 0 -- a peek under another period sees nothing and clears nothing
    elseif s.W ~= W and c > L and not force then
      return 0, L, 0, -1, 0, 0 -- nor does a rejection
    elseif s.W ~= W then
      s.raw, s.W, s.last, s.rawLast, s.S, s.set, s.stored, s.topOnly = nil, W, 0, 0, 0, {}, false, nil
    end
    local cur = fdiv(now, W)
    local b = max(cur, s.last)
    local d, S = b - s.last, s.S
    if d > K then
      s.raw, S = nil, 0
    elseif s.raw and d > 0 then
      -- S is the sum of the counts: of the d that left and the K+1-d kept,
      -- the fewer are read.
      if d + d > K + 1 then
        S = 0
        for i = 0, K - d do S = S + rcount(s, b, i) end
      else
        for i = -d, -1 do S = S - rcount(s, b, i) end
      end
    end
    if c > 0 and not force and S + c > L then
      local retry = c <= L and rwait(s, b, W, now, S, L - c) or -1
      local remaining, reset, nx = rafter(s, b, W, now, L, S)
      return 0, remaining, reset, retry, nx, 0
    end
    local placed = 0
    if c > 0 then
      local top = rcount(s, b, K)
      s.set[K] = min(NMAX, top + c)
      S, placed = S + s.set[K] - top, b * W
      if s.topOnly == nil then s.topOnly = top end
    elseif c < 0 then
      local g, hi, lo = -c, K, 0
      if stamp ~= 0 then
        hi = fdiv(stamp, W) - b + K -- only the stamp's bucket, if it still counts
        lo = hi
      end
      for i = hi, max(lo, 0), -1 do
        if g == 0 or i > K then break end
        local v = rcount(s, b, i)
        local t = min(g, v)
        if t > 0 then s.set[i], S, g, s.topOnly = v - t, S - t, g - t, false end
      end
    end
    s.last, s.S = b, S
    local remaining, reset, nx = rafter(s, b, W, now, L, S)
    if c ~= 0 then
      s.dirty, s.exp = true, now + reset
      if S == 0 then s.W = nil end -- empty: absent for the rest of the call
    end
    return 1, remaining, reset, 0, nx, placed
  end

  -- rollingWrite writes s: an admission into the bucket last written (its
  -- count above 0) rewrites S and that count in place, keeping the expiry;
  -- any other write sets the value, cut from the read one where it can.
  local function rollingWrite(s, ttl, _, minTTL)
    local b, raw, top = s.last, s.raw, s.set[K]
    local d = b - s.rawLast
    local only = type(s.topOnly) == 'number' -- only the current count changed
    if only and s.topOnly > 0 and s.stored and d == 0 then
      redis.call('SETRANGE', s.key, RH - 16, fmt('%015d %010d', s.S, top))
      if minTTL > 0 then redis.call('PEXPIRE', s.key, ttl) end -- WithClock's
      return
    end
    local v
    if only and raw == nil then
      v = fmt(RFRESH, s.W, b, s.S, top)
    elseif only and d <= K then
      v = fmt('R2 %015d %015d %015d %010d ', s.W, b, s.S, top)
      if d == 0 then
        v = v .. sub(raw, RH + RW + 1, RH + (K + 1) * RW)
      else
        v = v .. sub(RZEROS, 1, (d - 1) * RW) .. sub(raw, RH + 1, RH + (K - d + 1) * RW)
      end
    else
      local parts = { fmt('R2 %015d %015d %015d ', s.W, b, s.S) }
      for i = K, 0, -1 do parts[#parts + 1] = fmt('%010d ', rcount(s, b, i)) end
      v = table.concat(parts)
    end
    redis.call('SET', s.key, v, 'PX', ttl)
  end

  -- load names every field a decision sets, so that the table is sized once.
  local function load(key, raw)
    local W, last, S
    if #raw == RH + (K + 1) * RW and sub(raw, 1, 3) == 'R2 ' then
      W, last, S = tonum(sub(raw, 4, 18)), tonum(sub(raw, 20, 34)), tonum(sub(raw, 36, 50))
    end
    if not (W and last and S) then raw, W, last, S = nil, nil, nil, nil end
    return { key = key, raw = raw, stored = raw ~= nil, W = W, last = last, rawLast = last, S = S, set = raw and {},
      dirty = nil, exp = nil, topOnly = nil }
  end

  local function anchor(s, now, P)
    if not (s.W == cdiv(P, K) and s.last > fdiv(now, s.W)) then return false end
    -- The buckets from now / W on are read as now / W's, the older ones move up.
    local W = s.W
    local cur = fdiv(now, W)
    local e, n, S, h = s.last - cur, {}, 0, -1
    for i = 0, K do n[i] = 0 end
    for i = 0, K do n[min(K, i + e)] = n[min(K, i + e)] + rcount(s, s.last, i) end
    n[K] = min(NMAX, n[K])
    for i = 0, K do S, h = S + n[i], n[i] > 0 and i or h end
    s.raw, s.set, s.last, s.S, s.topOnly, s.exp = nil, n, cur, S, false, (cur + h + 1) * W
    return true
  end

  ops['0'] = { load = load, anchor = anchor, decide = rolling, write = rollingWrite }
end

if uses['4'] then
  local function after(t, now, T, tau)
    local remaining = fdiv(max(0, tau - (t - now)), T)
    return remaining, t - now, remaining == 0 and (t - now) - tau + T or 0
  end

  -- gcraOtherRate decides on a state written under another emission
  -- interval s.T (the limit changed, or callers disagree): u units held,
  -- each leaving at the rate it was written at; a write stores them at T.
  local function gcraOtherRate(s, now, L, B, T, tau, c, force, stamp)
    local d = s.tat - now
    local u = cdiv(d, s.T)
    local remaining, nx = max(0, B - u), 0
    if remaining == 0 then nx = d - (B - 1) * s.T end
    if c > 0 and not force and (c > B or u + c > B) then
      local retry = c <= B and d - (B - c) * s.T or -1
      return 0, remaining, d, retry, nx, 0
    end
    if c == 0 then return 1, remaining, d, 0, nx, 0 end
    local n = u -- a stamped refund: its stamp is of another rate's scale
    if c > 0 then n = u + c elseif stamp == 0 then n = u - min(-c, u) end
    local nt = now + min(n * T, debtHorizon)
    s.tat, s.at, s.T, s.exp, s.dirty = nt, now, T, nt, true
    remaining, d, nx = after(nt, now, T, tau)
    return 1, remaining, d, 0, nx, c > 0 and nt or 0
  end

  local function gcra(s, now, L, P, B, c, force, stamp)
    if B == 0 then B = L end
    local T = cdiv(P, L)
    local tau = T * B
    if s.T and s.T ~= T and s.tat > now then return gcraOtherRate(s, now, L, B, T, tau, c, force, stamp) end
    local t0 = max(s.tat or now, now)
    if c > 0 and not force and (c > B or (t0 - now) + c * T > tau) then
      local retry = c <= B and (t0 - now) + c * T - tau or -1
      local remaining, reset, nx = after(t0, now, T, tau)
      return 0, remaining, reset, retry, nx, 0
    end
    local nt = t0
    if c > 0 then
      nt = now + min((t0 - now) + c * T, debtHorizon) -- a forced charge saturates
    elseif c < 0 and stamp ~= 0 then
      -- only the part of the stamped admission still outstanding comes back
      nt = max(t0 - min(-c * T, max(0, stamp - now)), now)
    elseif c < 0 then
      nt = max(t0 + c * T, now)
    end
    if c ~= 0 then s.tat, s.at, s.T, s.exp, s.dirty = nt, now, T, nt, true end
    local remaining, reset, nx = after(nt, now, T, tau)
    return 1, remaining, reset, 0, nx, c > 0 and nt or 0
  end

  local function load(key, raw)
    local tat, at, T = string.match(raw, '^(%d+) (%d+) (%d+)$')
    return { key = key, tat = tonum(tat), at = tonum(at), T = tonum(T) }
  end

  local function anchor(s, now)
    if not (s.at and s.at > now) then return false end
    s.tat, s.at, s.exp = s.tat - (s.at - now), now, s.tat - (s.at - now)
    return true
  end

  local function write(s, ttl) redis.call('SET', s.key, fmt('%d %d %d', s.tat, s.at, s.T), 'PX', ttl) end
  ops['4'] = { load = load, anchor = anchor, decide = gcra, write = write }
end

-- windowAnchor is the fixed and sliding windows' anchor.
local windowAnchor
if uses['2'] or uses['3'] then
  function windowAnchor(s, now, P)
    if not (s.ws and s.ws > now) then return false end
    local ws = fdiv(now, P) * P
    s.ws, s.exp = ws, now
    if s.cur and s.cur > 0 then s.exp = ws + 2 * P elseif (s.count or s.prev + s.cur) > 0 then s.exp = ws + P end
    return true
  end
end

if uses['3'] then
  local function fixed(s, now, L, P, _, c, force, stamp)
    local ws = fdiv(now, P) * P
    local fin = ws + P
    local count = s.ws == ws and s.count or 0
    local function after() return max(0, L - count), count > 0 and fin - now or 0, count >= L and fin - now or 0 end
    if c > 0 and not force and count + c > L then
      local remaining, reset, nx = after()
      return 0, remaining, reset, c > L and -1 or fin - now, nx, 0
    end
    if c ~= 0 then
      if not (c < 0 and stamp ~= 0 and fdiv(stamp, P) * P ~= ws) then count = min(countMax, max(0, count + c)) end
      s.ws, s.count, s.dirty, s.exp = ws, count, true, fin
      if count == 0 then s.exp = now end
    end
    local remaining, reset, nx = after()
    return 1, remaining, reset, 0, nx, c > 0 and now or 0
  end

  local function load(key, raw)
    local ws, count = string.match(raw, '^f (%d+) (%d+)$')
    return { key = key, ws = tonum(ws), count = ws and tonum(count) }
  end

  local function write(s, ttl) redis.call('SET', s.key, fmt('f %d %d', s.ws, s.count), 'PX', ttl) end
  ops['3'] = { load = load, anchor = windowAnchor, decide = fixed, write = write }
end

if uses['2'] then
  -- wait is when c units (at most L) fit, rem µs before the window ends (Pm: P in ms).
  local function wait(L, P, Pm, rem, prev, cur, c)
    if cur + c <= L then
      local X = min(1000000, fdiv((L - cur - c) * 1000000, prev))
      local R = cdiv((X + 1) * Pm, 1000000) - 1
      return rem - ((R + 1) * 1000 - 1)
    end
    local X = min(1000000, fdiv((L - c) * 1000000, cur))
    local R = cdiv((X + 1) * Pm, 1000000) - 1
    if R >= Pm then return rem end
    return rem + P - ((R + 1) * 1000 - 1)
  end
  local function after(L, P, Pm, rem, w, prev, cur)
    local remaining = fdiv(max(0, L * 1000000 - (prev * w + cur * 1000000)), 1000000)
    local reset = cur > 0 and rem + P or prev > 0 and rem or 0
    return remaining, reset, remaining == 0 and wait(L, P, Pm, rem, prev, cur, 1) or 0
  end

  local function window(s, now, L, P, _, c, force, stamp)
    local ws = fdiv(now, P) * P
    local prev, cur = 0, 0
    if s.ws == ws then
      prev, cur = s.prev, s.cur
    elseif s.ws == ws - P then
      prev = s.cur
    end
    local rem = ws + P - now
    local Pm = fdiv(P, 1000)
    local w = fdiv(fdiv(rem, 1000) * 1000000, Pm)
    if c > 0 and not force and prev * w + (cur + c) * 1000000 > L * 1000000 then
      local retry = c <= L and wait(L, P, Pm, rem, prev, cur, c) or -1
      local remaining, reset, nx = after(L, P, Pm, rem, w, prev, cur)
      return 0, remaining, reset, retry, nx, 0
    end
    if c ~= 0 then
      if c < 0 and stamp ~= 0 then
        local sws = fdiv(stamp, P) * P -- only from the stamp's window
        if sws == ws then
          cur = max(0, cur + c)
        elseif sws == ws - P then
          prev = max(0, prev + c)
        end
      else
        cur = min(countMax, max(0, cur + c))
      end
      s.ws, s.prev, s.cur, s.dirty = ws, prev, cur, true
      s.exp = cur > 0 and ws + 2 * P or prev > 0 and ws + P or now
    end
    local remaining, reset, nx = after(L, P, Pm, rem, w, prev, cur)
    return 1, remaining, reset, 0, nx, c > 0 and now or 0
  end

  local function load(key, raw)
    local ws, prev, cur = string.match(raw, '^w (%d+) (%d+) (%d+)$')
    return { key = key, ws = tonum(ws), prev = ws and tonum(prev), cur = ws and tonum(cur) }
  end

  local function write(s, ttl) redis.call('SET', s.key, fmt('w %d %d %d', s.ws, s.prev, s.cur), 'PX', ttl) end
  ops['2'] = { load = load, anchor = windowAnchor, decide = window, write = write }
end

-- The sliding log (ALGORITHMS.md): a header of LH bytes, "L2 k newest head
-- fin", then records of LR bytes, "t n" (n units admitted at t), the live
-- ones in [head, fin), read a record at a time (a decision costs the same at
-- 10 units or 10,000); s.mods (offset -> {t, n}) holds the changed ones.
local LH, LR = 59, 34

if uses['1'] then
  local function logHeader(k, newest, head, fin) return fmt('L2 %016d %016d %010d %010d\n', k, newest, head, fin) end
  local function logRecord(t, n) return fmt('%016d %016d\n', t, n) end

  local function logEmpty(s)
    s.k, s.newest, s.head, s.fin, s.sfin, s.stored, s.mods, s.at, s.chunk = 0, 0, LH, LH, LH, false, {}, -1, ''
    return s
  end

  local function logLoad(key)
    local s = logEmpty({ key = key })
    local h = redis.call('GETRANGE', key, 0, LH - 1)
    if #h == LH and sub(h, 1, 3) == 'L2 ' then
      local k, newest = tonum(sub(h, 4, 19)), tonum(sub(h, 21, 36))
      local head, fin = tonum(sub(h, 38, 47)), tonum(sub(h, 49, 58))
      if k and newest and head and fin and head >= LH and fin >= head then
        s.k, s.newest, s.head, s.fin, s.sfin, s.stored = k, newest, head, fin, fin, true
      end
    end
    return s
  end

  -- logRec is the record at byte offset o, read 8 at a time (backward: ending at o).
  local function logRec(s, o, backward)
    local m = s.mods[o]
    if m then return m[1], m[2] end
    if o < s.at or o + LR > s.at + #s.chunk then
      local from = o
      if backward then from = max(LH, o - 7 * LR) end
      s.at, s.chunk = from, redis.call('GETRANGE', s.key, from, min(from + 8 * LR, s.sfin) - 1)
    end
    local p = o - s.at
    return tonum(sub(s.chunk, p + 1, p + 16)) or 0, tonum(sub(s.chunk, p + 18, p + 33)) or 0
  end

  -- logUnit is the instant of the live unit at 0-based position idx (now if none).
  local function logUnit(s, head, idx, now)
    local seen = 0
    for o = head, s.fin - LR, LR do
      local t, n = logRec(s, o)
      seen = seen + n
      if seen > idx then return t end
    end
    return now
  end

  local function slidingLog(s, now, L, P, _, c, force, stamp)
    -- Drop the records that no longer count (in s only when writing).
    local head, k = s.head, s.k
    while head < s.fin do
      local t, n = logRec(s, head)
      if t + P > now then break end
      head, k = head + LR, k - n
    end
    if head >= s.fin then k = 0 end
    local newest = s.newest
    if c > 0 and not force and k + c > L then
      local retry = c <= L and logUnit(s, head, k + c - L - 1, now) + P - now or -1
      local reset, nx = k > 0 and newest + P - now or 0, k >= L and logUnit(s, head, k - L, now) + P - now or 0
      return 0, max(0, L - k), reset, retry, nx, 0
    end
    if c ~= 0 then s.head, s.k = head, k end
    local placed = 0
    if c > 0 then
      local o = s.fin - LR
      if k > 0 and s.newest == now then -- units of the newest record's instant join it
        local _, n = logRec(s, o, true)
        s.mods[o] = { now, n + c }
      else
        s.mods[s.fin] = { now, c }
        s.fin = s.fin + LR
      end
      s.k, s.newest, placed = k + c, now, now
    elseif c < 0 then
      local take, o = min(-c, k), s.fin - LR
      while take > 0 and o >= s.head do
        -- the newest units, or those of the stamped runs (newest first)
        local t, n = logRec(s, o, true)
        if stamp ~= 0 and t < stamp then break end
        if (stamp == 0 or t == stamp) and n > 0 then
          local g = min(take, n)
          s.mods[o], take, s.k = { t, n - g }, take - g, s.k - g
        end
        o = o - LR
      end
      while s.fin > s.head do -- records left empty at the end go
        local t, n = logRec(s, s.fin - LR, true)
        if n > 0 then s.newest = t break end
        s.fin = s.fin - LR
      end
      if s.fin <= s.head then s.k = 0 end
    end
    if c ~= 0 then
      k, newest = s.k, s.newest
      s.dirty, s.exp = true, newest + P
      if k <= 0 then s.exp = now end
    end
    local reset, nx = k > 0 and newest + P - now or 0, k >= L and logUnit(s, head, k - L, now) + P - now or 0
    if c ~= 0 and k <= 0 then logEmpty(s) end
    return 1, max(0, L - k), reset, 0, nx, placed
  end

  -- logWrite writes the records s changed and its header; a log whose dead
  -- bytes (before head, after fin) outweigh its live ones is rewritten with
  -- the live ones only: it holds about twice its live records at most.
  local function logWrite(s, ttl)
    if not s.stored then
      local parts = { logHeader(s.k, s.newest, LH, s.fin) }
      for o = LH, s.fin - LR, LR do parts[#parts + 1] = logRecord(s.mods[o][1], s.mods[o][2]) end
      redis.call('SET', s.key, table.concat(parts), 'PX', ttl)
      return
    end
    for o, m in pairs(s.mods) do
      if o >= s.head and o < s.fin then redis.call('SETRANGE', s.key, o, logRecord(m[1], m[2])) end
    end
    local waste = s.head - LH + max(0, redis.call('STRLEN', s.key) - s.fin)
    if waste > s.fin - s.head then
      local live = redis.call('GETRANGE', s.key, s.head, s.fin - 1)
      redis.call('SET', s.key, logHeader(s.k, s.newest, LH, LH + #live) .. live, 'PX', ttl)
    else
      redis.call('SETRANGE', s.key, 0, logHeader(s.k, s.newest, s.head, s.fin))
      redis.call('PEXPIRE', s.key, ttl)
    end
  end

  local function anchor(s, now, P)
    if not (s.k > 0 and s.newest > now) then return false end
    local o = s.fin - LR -- the records later than now are read as now
    while o >= s.head do
      local t, n = logRec(s, o, true)
      if t <= now then break end
      s.mods[o], o = { now, n }, o - LR
    end
    s.newest, s.exp = now, now + P
    return true
  end

  ops['1'] = { load = logLoad, anchor = anchor, decide = slidingLog, write = logWrite }
end

-- Concurrency: the key is a sorted set of lease ids scored by expiry, its
-- companion (same slot) a hash of id -> units, with the units held under
-- '#', the now of the last write under '@' and an offset under '+' (a lease
-- expires at its score minus it: a clock behind the state moves every expiry
-- in one write). A decision drops expired leases and reads the one it names,
-- at a cost that does not grow with the leases. s.pend holds the leases a
-- call changes (id -> {n, exp, units unchanged}, false: released) until
-- store, s.orig them as they were (the Cluster undo). A lease whose units
-- were lost counts unknownUnits (backend.MaxLimit): full until it expires.
local unknownUnits = 1000000000

local function companion(key, x)
  local a = string.find(key, '{', 1, true)
  if a then
    local b = string.find(key, '}', a + 1, true)
    if b and b > a + 1 then return key .. '#' .. (x or 'n') end -- the key's own hash tag
  end
  return '{' .. key .. '}#' .. (x or 'n')
end

-- onceKey is the entry of once id on key (backend.Request.Once; '0': none), in its slot; KEYS declares it after the
-- requests' keys (store.go's onceKeyOf). It holds the µs until which it stands: a forced charge's record (onceSet, for
-- min(2P, 1 min) from now: backend.OnceKept), or, negated, a reservation's ticket (ticketSet, for 2P: backend.TicketKept).
-- onceRead is 't' for a ticket that stands at now, 'r' for a record, nil for neither.
local function onceKey(key, id) if id ~= '0' then return companion(key, 'o' .. id) end end
local function onceSet(m, now, P, t) local h = math.min(2 * P, 6e7); redis.call('SET', m, now + h, 'PX', max(cdiv(h, 1000), t)) end
local function ticketSet(m, now, P, t) redis.call('SET', m, -(now + 2 * P), 'PX', max(cdiv(2 * P, 1000), t)) end
local function onceRead(m, now)
  local v = tonum(redis.call('GET', m)) or 0
  if v < 0 and -v > now then return 't' elseif v > now then return 'r' end
end

if uses['5'] then
  -- leaseTouch records lease id as stored (expiring at e with n units, or
  -- absent when e is nil) before the call first changes it.
  local function leaseTouch(s, id, e, n)
    if s.orig[id] ~= nil then return end
    if e then s.orig[id] = fmt('%d %d', e + s.off, n) else s.orig[id] = '' end
  end

  -- leaseCheck reads the companion's '#', '@' and '+', and the earliest
  -- score; a companion missing, of another type, or with a field out of
  -- range ('#' below card, the leases; '+' at or past the earliest score)
  -- is rebuilt from the leases first, lost units counting unknownUnits
  -- (eviction can drop one of the two keys; the count never loses a lease).
  local function leaseCheck(key, hkey, now, card)
    local h = redis.pcall('HMGET', hkey, '#', '@', '+')
    local cnt, at, off = false, false, false
    if not h.err then cnt, at, off = tonum(h[1]), tonum(h[2]), tonum(h[3]) end
    local first = tonum(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
    local int = function(v) return v and v >= 0 and v < 2 ^ 53 and v == math.floor(v) end
    if int(cnt) and int(at) and int(off) and cnt >= card and off < first then return h, first end
    if not int(off) or off >= first then off = 0 end -- later expiries: never earlier
    local ids = redis.call('ZRANGE', key, 0, -1)
    local ns = {}
    if not h.err then ns = redis.call('HMGET', hkey, unpack(ids)) end
    redis.call('DEL', hkey)
    cnt = 0
    for j, id in ipairs(ids) do
      local n = tonum(ns[j])
      if not int(n) or n < 1 or n > unknownUnits then n = unknownUnits end
      redis.call('HSET', hkey, id, n)
      cnt = cnt + n
    end
    redis.call('HSET', hkey, '#', cnt, '@', now, '+', off)
    return { cnt, now, off }, first
  end

  -- leaseOrphans gives the leases of a companion whose sorted set was lost
  -- (eviction) the companion's expiry, the latest of theirs, and reports
  -- whether there were any: the key stays full until they could expire.
  local function leaseOrphans(key, hkey, now)
    local ttl = redis.call('PTTL', hkey)
    if ttl <= 0 or redis.call('TYPE', hkey).ok ~= 'hash' then return false end
    local off = tonum(redis.call('HGET', hkey, '+')) or 0
    local kv, any = redis.call('HGETALL', hkey), false
    for j = 1, #kv, 2 do
      if kv[j] ~= '#' and kv[j] ~= '@' and kv[j] ~= '+' then
        redis.call('ZADD', key, now + ttl * 1000 + max(0, off), kv[j])
        any = true
      end
    end
    if any then redis.call('PEXPIRE', key, ttl) end
    return any
  end

  -- leaseLoad reads key's state and writes at once, whatever the call
  -- decides, the drop of expired leases and a clock behind the last write:
  -- an expired lease never counts again. Another type fails (WRONGTYPE).
  local function leaseLoad(key, _, now, minTTL)
    local s = { key = key, hkey = companion(key), pend = {}, orig = {}, count = 0, off = 0 }
    local card = redis.call('ZCARD', key)
    if card == 0 then
      if not leaseOrphans(key, s.hkey, now) then
        s.clean = true -- what the companion still holds is stale
        return s
      end
      card = redis.call('ZCARD', key)
    end
    local h, first = leaseCheck(key, s.hkey, now, card)
    local at = tonum(h[2]) or now
    s.count, s.off = tonum(h[1]) or 0, tonum(h[3]) or 0
    local wrote = at > now
    s.at = at
    if wrote then
      s.off, s.at = s.off + at - now, now
      redis.call('HSET', s.hkey, '@', now, '+', s.off)
    end
    local gone = {} -- the earliest lease tells whether any expired
    if first <= now + s.off then gone = redis.call('ZRANGEBYSCORE', key, '-inf', now + s.off, 'LIMIT', 0, 1000) end
    while #gone > 0 do
      for _, n in ipairs(redis.call('HMGET', s.hkey, unpack(gone))) do s.count = s.count - (tonum(n) or 0) end
      redis.call('HDEL', s.hkey, unpack(gone))
      redis.call('ZREM', key, unpack(gone))
      if s.count <= 0 or redis.call('ZCARD', key) == 0 then
        redis.call('DEL', key, s.hkey)
        s.count, s.off, s.clean = 0, 0, false
        return s
      end
      redis.call('HSET', s.hkey, '#', s.count, '@', now)
      s.at, gone, wrote = now, redis.call('ZRANGEBYSCORE', key, '-inf', now + s.off, 'LIMIT', 0, 1000), true
    end
    if wrote then -- both expire with the last lease
      local top = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
      local ttl = max(1, cdiv(tonum(top[2]) - s.off - now, 1000), minTTL)
      redis.call('PEXPIRE', key, ttl)
      redis.call('PEXPIRE', s.hkey, ttl)
    end
    return s
  end

  -- leaseWait is the time until x more units fit, walking leases by expiry.
  local function leaseWait(s, now, L, count, x)
    local extra = {}
    for _, p in pairs(s.pend) do if p then extra[#extra + 1] = p end end
    table.sort(extra, function(p, q) return p[2] < q[2] end)
    local xi, from = 1, 0
    while true do
      local got = redis.call('ZRANGE', s.key, from, from + 15, 'WITHSCORES')
      local ids = {}
      for j = 1, #got, 2 do ids[#ids + 1] = got[j] end
      local ns = {}
      if #ids > 0 then ns = redis.call('HMGET', s.hkey, unpack(ids)) end
      local last = #ids < 16 -- then the pending leases left come after
      for j = 1, #ids + 1 do
        local e = math.huge
        if j <= #ids then e = tonum(got[2 * j]) - s.off elseif not last then break end
        while extra[xi] and extra[xi][2] <= e do
          count = count - extra[xi][1]
          if count + x <= L then return extra[xi][2] - now end
          xi = xi + 1
        end
        if j <= #ids and s.pend[ids[j]] == nil and e > now then
          count = count - (tonum(ns[j]) or 0)
          if count + x <= L then return e - now end
        end
      end
      if last then return 0 end
      from = from + 16
    end
  end

  -- leaseLast is the largest expiry of a live lease.
  local function leaseLast(s)
    local top, from = 0, 0
    for _, p in pairs(s.pend) do if p then top = max(top, p[2]) end end
    while true do
      local got = redis.call('ZREVRANGE', s.key, from, from + 15, 'WITHSCORES')
      for j = 1, #got, 2 do
        if s.pend[got[j]] == nil then return max(top, tonum(got[j + 1]) - s.off) end
      end
      if #got < 32 then return top end
      from = from + 16
    end
  end

  local function leases(s, now, L, P, _, c, force, id)
    local n, e, p
    if c ~= 0 then
      p = s.pend[id]
      if p then
        n, e = p[1], p[2]
      elseif p == nil then
        e = tonum(redis.call('ZSCORE', s.key, id))
        if e then e = e - s.off end
        if e and e > now then
          n = tonum(redis.call('HGET', s.hkey, id)) or 0
          leaseTouch(s, id, e, n)
        else
          e = nil
        end
      end
    end
    local count, placed = s.count, 0
    if c > 0 and e then
      s.pend[id] = { n, now + P, not p or p[3] } -- a renewal: stored units stay as stored
    elseif c > 0 and not force and count + c > L then
      local retry = c <= L and leaseWait(s, now, L, count, c) or -1
      local reset = count > 0 and leaseLast(s) - now or 0
      local nx = count >= L and (c == 1 and retry or leaseWait(s, now, L, count, 1)) or 0
      return 0, max(0, L - count), reset, retry, nx, 0
    elseif c > 0 then
      leaseTouch(s, id)
      s.pend[id], count, placed = { c, now + P }, count + c, 1
    elseif c < 0 and e then
      if n + c <= 0 then
        s.pend[id], count = false, count - n
      else
        s.pend[id], count = { n + c, e }, count + c
      end
    end
    s.count = count
    local reset, nx = count > 0 and leaseLast(s) - now or 0, count >= L and leaseWait(s, now, L, count, 1) or 0
    if c ~= 0 then s.dirty, s.exp = true, now + reset end
    return 1, max(0, L - count), reset, 0, nx, placed
  end

  local function leaseWrite(s, ttl, now)
    if s.clean then
      redis.call('DEL', s.hkey)
      s.clean = false
    end
    for id, p in pairs(s.pend) do
      if p then
        redis.call('ZADD', s.key, p[2] + s.off, id)
        if not p[3] then redis.call('HSET', s.hkey, id, p[1]) end
      else
        redis.call('ZREM', s.key, id)
        redis.call('HDEL', s.hkey, id)
      end
    end
    s.pend = {}
    redis.call('HSET', s.hkey, '#', s.count, '@', now, '+', s.off)
    redis.call('PEXPIRE', s.key, ttl)
    redis.call('PEXPIRE', s.hkey, ttl)
  end

  ops['5'] = { load = leaseLoad, anchor = function() return false end, decide = leases, write = leaseWrite }
end

-- store writes s, a state a decision changed, with its TTL (when it is full
-- again, in ms, at least 1 and minTTL), or deletes it when it is empty.
local function store(s, alg, now, minTTL)
  if s.exp > now then return ops[alg].write(s, max(1, cdiv(s.exp - now, 1000), minTTL), now, minTTL) end
  if s.hkey then redis.call('DEL', s.key, s.hkey) else redis.call('DEL', s.key) end
end
