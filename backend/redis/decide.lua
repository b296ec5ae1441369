-- One decision of ceiling's Redis backend: every request of a Decide call (or,
-- on Redis Cluster, of one hash-slot group) is evaluated against the stored
-- state, then written all or nothing. The arithmetic is backend/ALGORITHMS.md's,
-- in whole microseconds; every value stays an integer under 2^53, so Lua's
-- doubles are exact (floor division is corrected below to stay exact too).
--
-- KEYS[i]      the stored key of request i
-- ARGV[1]      now in µs, or "" to read the server's TIME
-- ARGV[2]      minimum TTL in ms (0 in production)
-- ARGV[3]      "1" to add each request's peek of the unchanged state to
--              the reply (Redis Cluster: another slot may reject the call)
-- ARGV[4+8(i-1) ...] request i: algorithm (0 rolling window, 1 sliding
--              log, 2 sliding window, 3 fixed window, 4 gcra, 5
--              concurrency), limit, period µs, burst (concurrency: the
--              lease id), cost, force (0/1), shadow (0/1), stamp (µs, or 0)
--
-- A stamp marks a refund undoing units this backend consumed at that instant
-- (a rejected cross-slot request on Redis Cluster): it gives back only units
-- that still count, so the undo can never free more than was taken.
--
-- Reply: {now, rejected, then per request: allowed, remaining, reset µs,
-- retry µs (-1 never), next µs [, peek remaining, peek reset µs, peek next
-- µs]}. In a rejected call every admitted request reports the unchanged
-- state, as a peek would.
-- With peeks (a call spanning Cluster slots) the reply ends, per request,
-- with its key as it was and as the script left it: value before ('' when
-- absent), PTTL before (ms), what the script did (0 nothing, 1 set,
-- 2 deleted) and the value it set, so that the client can put the key back
-- exactly if another slot rejects the call (see undo.lua).
--
-- Stored values are GCRA's bare tat (written before as "g tat", still
-- read), or strings "<tag> <numbers...>": R2 w last S n16 .. n0 (fixed
-- width, ALGORITHMS.md; "R w last S n0 .. n16" before, still read) | f start count | w start prev cur | c id n exp id n exp ... (leases,
-- see concurrency below). A sliding log is the fixed-width
-- layout of ALGORITHMS.md ("L2 k newest head fin", then records "t n" of n
-- units admitted at t, the live ones between byte offsets head and fin),
-- which the script reads and writes a record at a time: an admission costs
-- the same at 10 units or 10,000. A log in the previous layout ("L k last
-- ts n ...") is read whole and rewritten in this one; a value with another
-- tag (the rule changed algorithm, the oldest "l ..." log) counts as absent.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local minTTL = tonumber(ARGV[2])
local withPeeks = ARGV[3] == '1'

-- Only the algorithms the call uses are defined: a script defines its
-- functions on every run, and defining every algorithm's cost a lone
-- decision a quarter of its Redis CPU.
local need = {}
for a = 4, #ARGV, 8 do
  need[ARGV[a]] = true
end
local rolling, gcra, fixed, window, leases
local logHeader, logRecord, logOpen, logParse, logRec
local logRuns, logMaterial, logStep, logCommit, logValue

local floor, max, min = math.floor, math.max, math.min

-- How far past now forced charges can push a GCRA key (2^52 µs), and where
-- a window's count saturates (2^40): ALGORITHMS.md.
local debtHorizon, countMax = 4503599627370496, 1099511627776

-- fdiv is floor(a / b) for integers a, b > 0, exact: the double quotient can
-- round up to the next integer when a/b is just below it.
local function fdiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  return fdiv(a + b - 1, b)
end

-- One MGET reads every key (a key named twice is read twice, used once),
-- but a sliding log's: its header is read alone (logOpen), unless the reply
-- must carry every key's value (withPeeks).
local raws = {}
do
  local names, idx = {}, {}
  for i = 1, #KEYS do
    if withPeeks or ARGV[4 + (i - 1) * 8] ~= '1' then
      names[#names + 1], idx[#idx + 1] = KEYS[i], i
    end
  end
  if #names == 1 then
    raws[idx[1]] = redis.call('GET', names[1])
  elseif #names > 0 then
    local got = redis.call('MGET', unpack(names))
    for j = 1, #idx do
      raws[idx[j]] = got[j]
    end
  end
end
local ttls = {}
if withPeeks then
  for i = 1, #KEYS do
    ttls[i] = redis.call('PTTL', KEYS[i])
  end
end
local states, order = {}, {}

-- A sliding log's layout (ALGORITHMS.md): a header of LH bytes, then records
-- of LR bytes, zero-padded decimals.
local LH, LR = 59, 34

if need['1'] then
  logHeader = function(k, newest, head, fin)
    return string.format('L2 %016.0f %016.0f %010.0f %010.0f\n', k, newest, head, fin)
  end
end

if need['1'] then
  logRecord = function(t, n)
    return string.format('%016.0f %016.0f\n', t, n)
  end
end

-- A log read a record at a time is { lg = lg } with lg the stored header
-- (k units live, newest instant, live records in bytes [head, fin), stored
-- false for no log) and the records read so far; after an admission or a
-- refund, { lg = lg, pend = pend } also holds what the commit writes. A log
-- read whole is a flat array of runs, instant and units, oldest first
-- (logRuns decides it).

-- logOpen reads key's header.
if need['1'] then
  logOpen = function(key)
    local lg = { key = key, k = 0, newest = 0, head = LH, fin = LH, stored = false, at = -1, chunk = '' }
    local h = redis.call('GETRANGE', key, 0, LH - 1)
    if string.sub(h, 1, 3) == 'L2 ' and #h == LH then
      lg.k, lg.newest = tonumber(string.sub(h, 4, 19)), tonumber(string.sub(h, 21, 36))
      lg.head, lg.fin = tonumber(string.sub(h, 38, 47)), tonumber(string.sub(h, 49, 58))
      lg.stored = true
      return { lg = lg }
    elseif string.sub(h, 1, 2) == 'L ' then
      return logParse(redis.call('GET', key)) -- the previous layout, read whole
    end
    return { lg = lg }
  end
end

-- logParse reads a whole stored log, in this layout or the previous one,
-- into runs.
if need['1'] then
  logParse = function(raw)
    local runs = {}
    if string.sub(raw, 1, 3) == 'L2 ' then
      local head, fin = tonumber(string.sub(raw, 38, 47)), tonumber(string.sub(raw, 49, 58))
      for o = head, fin - LR, LR do
        runs[#runs + 1] = tonumber(string.sub(raw, o + 1, o + 16))
        runs[#runs + 1] = tonumber(string.sub(raw, o + 18, o + 33))
      end
    else
      for w in string.gmatch(string.match(raw, '^L %d+ %d+ (.*)$') or '', '%d+') do
        runs[#runs + 1] = tonumber(w)
      end
    end
    return runs
  end
end

-- logRec returns the instant and units of the record at byte offset o,
-- reading up to 8 records at a time, forward (or, backward, ending at o).
if need['1'] then
  logRec = function(lg, o, backward)
    if o < lg.at or o + LR > lg.at + #lg.chunk then
      local from = o
      if backward then from = max(lg.head, o - 7 * LR) end
      lg.at, lg.chunk = from, redis.call('GETRANGE', lg.key, from, min(from + 8 * LR, lg.fin) - 1)
    end
    local p = o - lg.at
    return tonumber(string.sub(lg.chunk, p + 1, p + 16)), tonumber(string.sub(lg.chunk, p + 18, p + 33))
  end
end

-- load returns the state of request i's key, parsed on first use; later
-- requests on the same key share it, and so see what earlier ones would
-- write.
local function load(i, tag)
  local key = KEYS[i]
  local s = states[key]
  if s == nil then
    s = { tag = '', v = {} }
    local raw = raws[i]
    if tag == 'l' and not withPeeks then
      s.tag, s.v = 'l', logOpen(key)
    elseif tag == 'l' and raw and string.sub(raw, 1, 1) == 'L' then
      s.tag, s.v = 'l', logParse(raw)
    elseif raw and string.sub(raw, 1, 1) == 'L' then
      s.tag = '' -- a sliding log, asked for by another algorithm: absent
    elseif raw and string.sub(raw, 1, 1) == 'R' then
      s.tag, s.v = 'R', { raw = raw } -- a rolling window is read as needed
    elseif raw and tonumber(raw) then
      s.tag, s.v = 'g', { tonumber(raw) } -- GCRA: the bare tat
    elseif raw then
      for w in string.gmatch(raw, '%S+') do
        if s.tag == '' then
          s.tag = w
        else
          s.v[#s.v + 1] = tonumber(w)
        end
      end
      if s.tag == 'l' then
        s.tag = '' -- the oldest sliding log form: absent
      end
    end
    states[key] = s
    order[#order + 1] = key
  end
  if s.tag ~= tag then
    s.tag, s.v = tag, {}
  end
  if s.orig == nil then
    s.orig = s.v -- algorithms replace s.v, never change it in place
  end
  return s
end

-- Each algorithm returns allowed, remaining, reset, retry, next; on admission
-- with a non-zero cost it replaces s.v and sets s.exp (when the state is full
-- again) and s.dirty.

-- The rolling window: K+1 counts of buckets W µs wide, stored fixed-width
-- ("R2 W last S " then the counts, the current bucket's first:
-- ALGORITHMS.md), so that a decision parses only the counts it needs and
-- writes the value back from slices of the one it read. (A call of one
-- rolling-window request runs rolling.lua, which also updates a value in
-- place.)
local K, NMAX = 16, 4294967295
local RH, RW, ZERO = 51, 11, '0000000000 ' -- header bytes, bytes per count

if need['0'] then
  -- rcount is count i (0..K, oldest first; i < 0: one that left) of the
  -- rolling value raw after a shift of d buckets, or its replacement in set.
  local function rcount(raw, d, set, i)
    local v = set[i]
    if v then return v end
    if raw == nil or i + d > K then return 0 end
    local o = RH + (K - i - d) * RW
    return tonumber(string.sub(raw, o + 1, o + 10))
  end
  -- rwait is when the buckets still counting hold at most x of S units.
  local function rwait(raw, d, set, S, b, W, x)
    local acc = 0
    for i = 0, K do
      acc = acc + rcount(raw, d, set, i)
      if S - acc <= x then return (b + i + 1) * W - now end
    end
  end
  local function rafter(raw, d, set, S, b, W, L)
    local reset, nx = 0, 0
    if S > 0 then
      local h = K
      while rcount(raw, d, set, h) == 0 do h = h - 1 end
      reset = (b + h + 1) * W - now
    end
    if S >= L then nx = rwait(raw, d, set, S, b, W, L - 1) end
    return max(0, L - S), reset, nx
  end
  -- rvalue is raw in this layout: a value of the previous one ("R ", the
  -- counts oldest first) is rewritten; any other value is absent.
  local function rvalue(raw)
    if raw == nil then
      return nil
    elseif #raw == RH + (K + 1) * RW and string.sub(raw, 1, 3) == 'R2 ' then
      return raw
    elseif #raw == RH - 1 + (K + 1) * RW and string.sub(raw, 1, 2) == 'R ' then
      local parts = { 'R2 ', string.sub(raw, 3, 50) }
      for i = K, 0, -1 do
        parts[#parts + 1] = string.sub(raw, 51 + i * RW, 50 + (i + 1) * RW)
      end
      return table.concat(parts)
    end
    return nil
  end
  rolling = function(s, L, P, c, force, stamp)
    local W = cdiv(P, K)
    local raw, last, S = rvalue(s.v.raw), 0, 0
    if raw and tonumber(string.sub(raw, 4, 18)) == W then
      last, S = tonumber(string.sub(raw, 20, 34)), tonumber(string.sub(raw, 36, 50))
    else
      raw = nil
    end
    local b = max(fdiv(now, W), last)
    local d = b - last
    if d > K then raw, S = nil, 0 end
    local set = {} -- the counts this request changes, by index
    if raw and d + d > K + 1 then
      -- S is the sum of the counts (ALGORITHMS.md): of the d that left and
      -- the K+1-d kept, the fewer are read.
      S = 0
      for i = 0, K - d do S = S + rcount(raw, d, set, i) end
    elseif raw then
      for i = -d, -1 do S = S - rcount(raw, d, set, i) end
    end
    if c > 0 and not force and S + c > L then
      local retry = -1
      if c <= L then retry = rwait(raw, d, set, S, b, W, L - c) end
      local remaining, reset, nx = rafter(raw, d, set, S, b, W, L)
      return 0, remaining, reset, retry, nx
    end
    local from = K + 1 -- the lowest count changed
    if c > 0 then
      local top = rcount(raw, d, set, K)
      set[K] = min(NMAX, top + c)
      S, from = S + set[K] - top, K
    elseif c < 0 then
      local g, hi, lo = -c, K, 0
      if stamp > 0 then
        -- undo units consumed at stamp: only its bucket, if it still counts
        hi = fdiv(stamp, W) - b + K
        lo = hi
      end
      for i = hi, lo, -1 do
        if g == 0 or i < 0 or i > K then break end
        local v = rcount(raw, d, set, i)
        local t = min(g, v)
        if t > 0 then
          set[i], S, g, from = v - t, S - t, g - t, i
        end
      end
    end
    local remaining, reset, nx = rafter(raw, d, set, S, b, W, L)
    if c ~= 0 then
      -- Newest first: the changed counts, then the read ones, shifted by d
      -- (the buckets that began since are 0).
      local parts = { string.format('R2 %015d %015d %015d ', W, b, S) }
      for i = K, from, -1 do parts[#parts + 1] = string.format('%010d ', rcount(raw, d, set, i)) end
      local keep = 0
      if raw then keep = max(0, min(from, K + 1 - d)) end
      if from > keep then parts[#parts + 1] = string.rep(ZERO, from - keep) end
      if keep > 0 then parts[#parts + 1] = string.sub(raw, RH + (K - d - keep + 1) * RW + 1, RH + (K - d + 1) * RW) end
      s.v, s.exp, s.dirty = { raw = table.concat(parts) }, now + reset, true
    end
    return 1, remaining, reset, 0, nx
  end
end

if need['4'] then
  gcra = function(s, L, P, B, c, force)
    if B == 0 then B = L end
    local T = cdiv(P, L)
    local tau = T * B
    local t0 = max(s.v[1] or now, now)
    local function after(t)
      local remaining, nx = fdiv(max(0, tau - (t - now)), T), 0
      if remaining == 0 then nx = t + T - now - tau end
      return remaining, t - now, nx
    end
    if c > 0 and not force and (c > B or t0 + c * T - now > tau) then
      local retry = -1
      if c <= B then retry = t0 + c * T - now - tau end
      local remaining, reset, nx = after(t0)
      return 0, remaining, reset, retry, nx
    end
    local nt = t0
    if c > 0 then
      nt = min(t0 + c * T, now + debtHorizon) -- a forced charge saturates
    elseif c < 0 then
      nt = max(t0 + c * T, now)
    end
    if c ~= 0 then
      s.v, s.exp, s.dirty = { nt }, nt, true
    end
    local remaining, reset, nx = after(nt)
    return 1, remaining, reset, 0, nx
  end
end

if need['3'] then
  fixed = function(s, L, P, c, force, stamp)
    local ws = fdiv(now, P) * P
    local fin = ws + P
    local count = 0
    if s.v[1] == ws then count = s.v[2] end
    if c > 0 and not force and count + c > L then
      local retry = fin - now
      if c > L then retry = -1 end
      local reset, nx = 0, 0
      if count > 0 then reset = fin - now end
      if count >= L then nx = fin - now end
      return 0, max(0, L - count), reset, retry, nx
    end
    if c ~= 0 and not (stamp > 0 and c < 0 and fdiv(stamp, P) * P ~= ws) then
      count = min(countMax, max(0, count + c))
      s.v, s.exp, s.dirty = { ws, count }, fin, true
      if count == 0 then s.exp = now end
    end
    local reset, nx = 0, 0
    if count > 0 then reset = fin - now end
    if count >= L then nx = fin - now end
    return 1, max(0, L - count), reset, 0, nx
  end
end

if need['2'] then
  window = function(s, L, P, c, force, stamp)
    local ws = fdiv(now, P) * P
    local prev, cur = 0, 0
    if s.v[1] == ws then
      prev, cur = s.v[2], s.v[3]
    elseif s.v[1] == ws - P then
      prev = s.v[3]
    end
    local rem = ws + P - now
    local Pm = fdiv(P, 1000)
    local w = fdiv(fdiv(rem, 1000) * 1000000, Pm)
    -- wait is the time until c units (at most L) fit, when they do not now.
    local function wait(prev, cur, c)
      if cur + c <= L then
        local X = min(1000000, fdiv((L - cur - c) * 1000000, prev))
        local R = cdiv((X + 1) * Pm, 1000000) - 1
        return rem - ((R + 1) * 1000 - 1)
      end
      local X = min(1000000, fdiv((L - c) * 1000000, cur))
      local R = cdiv((X + 1) * Pm, 1000000) - 1
      if R >= Pm then
        return rem
      end
      return rem + P - ((R + 1) * 1000 - 1)
    end
    local function after(prev, cur)
      local remaining = fdiv(max(0, L * 1000000 - (prev * w + cur * 1000000)), 1000000)
      local reset, nx = 0, 0
      if cur > 0 then
        reset = rem + P
      elseif prev > 0 then
        reset = rem
      end
      if remaining == 0 then nx = wait(prev, cur, 1) end
      return remaining, reset, nx
    end
    if c > 0 and not force and prev * w + (cur + c) * 1000000 > L * 1000000 then
      local retry = -1
      if c <= L then retry = wait(prev, cur, c) end
      local remaining, reset, nx = after(prev, cur)
      return 0, remaining, reset, retry, nx
    end
    if c ~= 0 then
      if stamp > 0 and c < 0 then
        local sws = fdiv(stamp, P) * P
        if sws == ws then
          cur = max(0, cur + c)
        elseif sws == ws - P then
          prev = max(0, prev + c)
        end
      else
        cur = min(countMax, max(0, cur + c))
      end
      s.v, s.dirty = { ws, prev, cur }, true
      if cur > 0 then
        s.exp = ws + 2 * P
      elseif prev > 0 then
        s.exp = ws + P
      else
        s.exp = now
      end
    end
    local remaining, reset, nx = after(prev, cur)
    return 1, remaining, reset, 0, nx
  end
end

if need['1'] then
  logRuns = function(s, L, P, c, force, stamp)
    -- Drop the runs whose entries no longer count (e + P <= now).
    local runs, k = {}, 0
    for i = 1, #s.v - 1, 2 do
      if s.v[i] + P > now then
        runs[#runs + 1] = s.v[i]
        runs[#runs + 1] = s.v[i + 1]
        k = k + s.v[i + 1]
      end
    end
    local function after(runs, k)
      local reset, nx = 0, 0
      if k > 0 then reset = runs[#runs - 1] + P - now end
      if k >= L then
        local seen = 0
        for i = 1, #runs - 1, 2 do
          seen = seen + runs[i + 1]
          if seen > k - L then
            nx = runs[i] + P - now
            break
          end
        end
      end
      return max(0, L - k), reset, nx
    end
    if c > 0 and not force and k + c > L then
      local retry = -1
      if c <= L then
        -- The entry at 0-based position k + c - L - 1 makes room when it expires.
        local idx, seen = k + c - L - 1, 0
        for i = 1, #runs - 1, 2 do
          seen = seen + runs[i + 1]
          if seen > idx then
            retry = runs[i] + P - now
            break
          end
        end
      end
      local remaining, reset, nx = after(runs, k)
      return 0, remaining, reset, retry, nx
    end
    if c > 0 then
      if runs[#runs - 1] == now then
        runs[#runs] = runs[#runs] + c
      else
        runs[#runs + 1] = now
        runs[#runs + 1] = c
      end
      k = k + c
    elseif c < 0 then
      local take = min(-c, k)
      local i = #runs - 1
      while take > 0 and i >= 1 do
        if stamp > 0 and runs[i] ~= stamp then
          i = i - 2
        else
          local n = min(take, runs[i + 1])
          runs[i + 1] = runs[i + 1] - n
          take, k = take - n, k - n
          if runs[i + 1] == 0 then
            table.remove(runs, i + 1)
            table.remove(runs, i)
          end
          i = i - 2
        end
      end
    end
    if c ~= 0 then
      s.v, s.dirty = runs, true
      if k > 0 then
        s.exp = runs[#runs - 1] + P
      else
        s.exp = now
      end
    end
    local remaining, reset, nx = after(runs, k)
    return 1, remaining, reset, 0, nx
  end
end

-- logMaterial reads a log held as { lg, pend } whole, with what its pending
-- write would change, into runs: for a second request on a key whose first
-- one wrote, so that it sees that write.
if need['1'] then
  logMaterial = function(v)
    local lg, pend = v.lg, v.pend or {}
    local runs = {}
    local head, fin = pend.head or lg.head, pend.fin or lg.fin
    for o = head, fin - LR, LR do
      local t, n = logRec(lg, o)
      runs[#runs + 1], runs[#runs + 2] = t, n
    end
    if pend.lastn then runs[#runs] = pend.lastn end
    if pend.merge then
      runs[#runs] = pend.merge + pend.add
    elseif (pend.add or 0) > 0 then
      runs[#runs + 1], runs[#runs + 2] = now, pend.add
    end
    return runs
  end
end

-- logStep decides a sliding log read a record at a time, with logRuns'
-- arithmetic: expired records are skipped from the front, a rejection's
-- retry reads the records up to the unit whose expiry makes room, an
-- admission appends one record and a refund takes records off the end.
if need['1'] then
  logStep = function(s, L, P, c, force, stamp)
    if s.v.pend or stamp > 0 then
      s.v = logMaterial(s.v)
      return logRuns(s, L, P, c, force, stamp)
    end
    local lg = s.v.lg
    local head, k = lg.head, lg.k
    while head < lg.fin do
      local t, n = logRec(lg, head)
      if t + P > now then break end
      head, k = head + LR, k - n
    end
    -- unit is the instant of the live unit at 0-based position idx, or now
    -- when the live records hold fewer (it is one being added).
    local function unit(idx)
      local seen = 0
      for o = head, lg.fin - LR, LR do
        local t, n = logRec(lg, o)
        seen = seen + n
        if seen > idx then return t end
      end
      return now
    end
    local reset, nx = 0, 0
    if k > 0 then reset = lg.newest + P - now end
    if c > 0 and not force and k + c > L then
      local retry = -1
      if c <= L then retry = unit(k + c - L - 1) + P - now end
      if k >= L then nx = unit(k - L) + P - now end
      return 0, max(0, L - k), reset, retry, nx
    end
    if c > 0 then
      if k + c >= L then nx = unit(k + c - L) + P - now end
      -- Units of the same instant as the newest record join it.
      local merge
      if k > 0 and lg.newest == now then
        local _, n = logRec(lg, lg.fin - LR, true)
        merge = n
      end
      k = k + c
      s.v = { lg = lg, pend = { head = head, k = k, newest = now, add = c, merge = merge } }
      s.exp, s.dirty, reset = now + P, true, P
    elseif c < 0 then
      -- Take the newest units back, record by record from the end.
      local take, fin, lastn, newest = min(-c, k), lg.fin, nil, now
      k = k - take
      while take > 0 do
        local _, n = logRec(lg, fin - LR, true)
        if n > take then
          lastn, take = n - take, 0
        else
          fin, take = fin - LR, take - n
        end
      end
      if k > 0 then newest = logRec(lg, fin - LR, true) end
      s.v = { lg = lg, pend = { head = head, k = k, newest = newest, fin = fin, lastn = lastn } }
      s.dirty, s.exp = true, now
      reset = 0
      if k > 0 then
        s.exp, reset = newest + P, newest + P - now
        if k >= L then nx = unit(k - L) + P - now end
      end
    elseif k >= L then
      nx = unit(k - L) + P - now
    end
    return 1, max(0, L - k), reset, 0, nx
  end
end

-- leases decides a Concurrency key: s.v holds id, n, exp per lease. A
-- positive cost acquires lease id (renews it when live), a negative one
-- releases its units.
if need['5'] then
  leases = function(s, L, P, c, force, id)
    local live, count, at = {}, 0, 0
    for j = 1, #s.v - 2, 3 do
      if s.v[j + 2] > now then
        live[#live + 1] = { s.v[j], s.v[j + 1], s.v[j + 2] }
        count = count + s.v[j + 1]
        if s.v[j] == id then at = #live end
      end
    end
    -- wait is the time until enough live leases expire for x more units.
    local function wait(cnt, x)
      local byExp = {}
      for j = 1, #live do byExp[j] = live[j] end
      table.sort(byExp, function(p, q) return p[3] < q[3] end)
      for j = 1, #byExp do
        cnt = cnt - byExp[j][2]
        if cnt + x <= L then return byExp[j][3] - now end
      end
      return 0
    end
    local function after(cnt)
      local reset, nx = 0, 0
      for j = 1, #live do reset = max(reset, live[j][3] - now) end
      if cnt >= L then nx = wait(cnt, 1) end
      return max(0, L - cnt), reset, nx
    end
    if c > 0 and at > 0 then
      live[at][3] = now + P
    elseif c > 0 and not force and count + c > L then
      local retry = -1
      if c <= L then retry = wait(count, c) end
      local remaining, reset, nx = after(count)
      return 0, remaining, reset, retry, nx
    elseif c > 0 then
      live[#live + 1] = { id, c, now + P }
      count = count + c
    elseif c < 0 and at > 0 then
      local n = live[at][2]
      if n + c <= 0 then
        count = count - n
        table.remove(live, at)
      else
        live[at][2], count = n + c, count + c
      end
    end
    if c ~= 0 then
      local nv, exp = {}, now
      for j = 1, #live do
        nv[3 * j - 2], nv[3 * j - 1], nv[3 * j] = live[j][1], live[j][2], live[j][3]
        exp = max(exp, live[j][3])
      end
      s.v, s.exp, s.dirty = nv, exp, true
    end
    local remaining, reset, nx = after(count)
    return 1, remaining, reset, 0, nx
  end
end

-- logCommit writes a log read a record at a time: the records and header
-- that changed (the log is rewritten compact once its expired records, or
-- those a refund took back, outweigh its live ones), or the whole log when
-- there was none.
if need['1'] then
  logCommit = function(key, v, ttl)
    local lg, pend = v.lg, v.pend
    local head, fin = pend.head, pend.fin or lg.fin
    if not lg.stored then
      local value = logHeader(pend.k, now, LH, LH + LR) .. logRecord(now, pend.add)
      redis.call('SET', key, value, 'PX', ttl)
      return value
    end
    if pend.lastn then
      redis.call('SETRANGE', key, fin - LR, logRecord(pend.newest, pend.lastn))
    end
    if pend.merge then
      redis.call('SETRANGE', key, fin - LR, logRecord(now, pend.merge + pend.add))
    elseif (pend.add or 0) > 0 then
      redis.call('SETRANGE', key, fin, logRecord(now, pend.add))
      fin = fin + LR
    end
    local waste = head - LH -- expired records, and records a refund took back
    if pend.fin then waste = waste + redis.call('STRLEN', key) - fin end
    if waste > fin - head then
      local live = redis.call('GETRANGE', key, head, fin - 1)
      redis.call('SET', key, logHeader(pend.k, pend.newest, LH, LH + #live) .. live, 'PX', ttl)
    else
      redis.call('SETRANGE', key, 0, logHeader(pend.k, pend.newest, head, fin))
      redis.call('PEXPIRE', key, ttl)
    end
  end
end

-- logValue is a log read whole, as stored.
if need['1'] then
  logValue = function(runs)
    local parts, k = { '' }, 0
    for j = 1, #runs - 1, 2 do
      k = k + runs[j + 1]
      parts[#parts + 1] = logRecord(runs[j], runs[j + 1])
    end
    parts[1] = logHeader(k, runs[#runs - 1], LH, LH + LR * (#runs / 2))
    return table.concat(parts)
  end
end

-- decide runs request i's algorithm on s with cost c.
local function decide(s, i, c)
  local a = 4 + (i - 1) * 8
  local alg = ARGV[a]
  local L, P = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local force, stamp = ARGV[a + 5] == '1', tonumber(ARGV[a + 7])
  if alg == '0' then
    return rolling(s, L, P, c, force, stamp)
  elseif alg == '4' then
    return gcra(s, L, P, tonumber(ARGV[a + 3]), c, force)
  elseif alg == '1' then
    if s.v.lg then
      return logStep(s, L, P, c, force, stamp)
    end
    return logRuns(s, L, P, c, force, stamp)
  elseif alg == '2' then
    return window(s, L, P, c, force, stamp)
  elseif alg == '5' then
    return leases(s, L, P, c, force, tonumber(ARGV[a + 3]))
  end
  return fixed(s, L, P, c, force, stamp)
end

local tags = { ['0'] = 'R', ['1'] = 'l', ['2'] = 'w', ['3'] = 'f', ['4'] = 'g', ['5'] = 'c' }

-- write stores s, the state of key a request changed, with its TTL
-- (passed as a number: Redis writes an integer's digits exactly), and
-- returns what it did for the undo: 1 and the value set, 2 for deleted.
local fmts = { f = 'f %d %d', w = 'w %d %d %d' }
local function write(key, s)
  if s.exp <= now then
    redis.call('DEL', key)
    return 2, ''
  end
  local ttl = max(1, cdiv(s.exp - now, 1000), minTTL)
  local value
  if s.tag == 'l' and s.v.lg then
    logCommit(key, s.v, ttl) -- never with peeks: the undo needs no value
    return 1, ''
  elseif s.tag == 'l' then
    value = logValue(s.v)
  elseif s.tag == 'R' then
    value = s.v.raw
  elseif s.tag == 'g' then
    value = s.v[1]
  elseif fmts[s.tag] then
    value = string.format(fmts[s.tag], unpack(s.v))
  else
    local parts = { s.tag }
    for j = 1, #s.v do
      parts[j + 1] = string.format('%d', s.v[j])
    end
    value = table.concat(parts, ' ')
  end
  redis.call('SET', key, value, 'PX', ttl)
  if type(value) == 'number' then value = string.format('%d', value) end
  return 1, value
end

-- The common call, one request, skips the bookkeeping of several.
if #KEYS == 1 and not withPeeks then
  local s = load(1, tags[ARGV[4]])
  local ok, remaining, reset, retry, nx = decide(s, 1, tonumber(ARGV[8]))
  local rejected = 0
  if ok == 0 and ARGV[10] ~= '1' then
    rejected = 1
  elseif s.dirty then
    write(KEYS[1], s)
  end
  return { now, rejected, ok, remaining, max(0, reset), retry, nx }
end
local per = 5
if withPeeks then per = 8 end
local out = { now, 0 }
local rejected = false
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 8
  local s = load(i, tags[ARGV[a]])
  local ok, remaining, reset, retry, nx = decide(s, i, tonumber(ARGV[a + 4]))
  if ok == 0 and ARGV[a + 6] ~= '1' then rejected = true end
  local o = 2 + (i - 1) * per
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = ok, remaining, max(0, reset), retry, nx
end

-- peek reports request i's key as it was before the call (cost 0 writes
-- nothing): what an admitted request reports when the call is rejected.
local function peek(i)
  local s = states[KEYS[i]]
  local _, remaining, reset, _, nx = decide({ tag = s.tag, v = s.orig }, i, 0)
  return remaining, max(0, reset), nx
end

if withPeeks then
  for i = 1, #KEYS do
    local o = 2 + (i - 1) * per
    if out[o + 1] == 1 then
      out[o + 6], out[o + 7], out[o + 8] = peek(i)
    else
      out[o + 6], out[o + 7], out[o + 8] = out[o + 2], out[o + 3], out[o + 5]
    end
  end
end

-- undo appends each request's key as it was and as the script left it
-- (written: key -> {1, value} set, {2, ''} deleted).
local function undo(written)
  if not withPeeks then
    return
  end
  for i = 1, #KEYS do
    local w = written[KEYS[i]] or { 0, '' }
    out[#out + 1] = raws[i] or ''
    out[#out + 1] = ttls[i]
    out[#out + 1] = w[1]
    out[#out + 1] = w[2]
  end
end

if rejected then
  out[2] = 1
  undo({})
  if not withPeeks then
    for i = 1, #KEYS do
      local o = 2 + (i - 1) * per
      if out[o + 1] == 1 then
        out[o + 2], out[o + 3], out[o + 5] = peek(i)
      end
    end
  end
  return out
end
local written = {}
for _, key in ipairs(order) do
  local s = states[key]
  if s.dirty then
    local what, value = write(key, s)
    if value ~= '' or what == 2 then written[key] = { what, value } end
  end
end
undo(written)
return out
