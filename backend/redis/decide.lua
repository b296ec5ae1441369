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
-- ARGV[4+8(i-1) ...] request i: algorithm (0 gcra, 1 sliding log,
--              2 sliding window, 3 fixed window), limit, period µs, burst,
--              cost, force (0/1), shadow (0/1), stamp (µs, or 0)
--
-- A stamp marks a refund undoing units this backend consumed at that instant
-- (a rejected cross-slot request on Redis Cluster): it gives back only units
-- that still count, so the undo can never free more than was taken.
--
-- Reply: {now, rejected, then per request: allowed, remaining, reset µs,
-- retry µs (-1 never) [, peek remaining, peek reset µs]}. In a rejected call
-- every admitted request reports the unchanged state, as a peek would.
--
-- Stored values are strings "<tag> <numbers...>": g tat | f start count |
-- w start prev cur | L k last ts n ts n ... (a sliding log: k units in its
-- runs, the newest run's instant, then the runs of n units admitted at ts,
-- oldest first). A value with another tag (the rule changed algorithm, or a
-- sliding log in the older "l ts n ..." form) counts as absent.
--
-- A sliding log is never parsed whole to admit or reject: its count and
-- newest instant are in the header, expired runs are skipped from the
-- front, and an admission appends a run to the unchanged text of the live
-- ones. Only a refund, rare, parses and rewrites every run. (Parsing every
-- run cost about 0.6 µs of Redis CPU per run, 0.6 ms for a log of 1000.)

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local minTTL = tonumber(ARGV[2])
local withPeeks = ARGV[3] == '1'

local floor, max, min = math.floor, math.max, math.min

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

-- One MGET reads every key (a key named twice is read twice, used once).
local raws = redis.call('MGET', unpack(KEYS))
local states, order = {}, {}

-- load returns the state of request i's key, parsed on first use; later
-- requests on the same key share it, and so see what earlier ones would
-- write.
local function load(i, tag)
  local key = KEYS[i]
  local s = states[key]
  if s == nil then
    s = { tag = '', v = {} }
    local raw = raws[i]
    if raw and string.sub(raw, 1, 2) == 'L ' then
      s.tag, s.v = 'l', { raw } -- a sliding log stays text (see above)
    elseif raw then
      for w in string.gmatch(raw, '%S+') do
        if s.tag == '' then
          s.tag = w
        else
          s.v[#s.v + 1] = tonumber(w)
        end
      end
      if s.tag == 'l' then
        s.tag = '' -- the older sliding log form: absent
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

-- Each algorithm returns allowed, remaining, reset, retry; on admission with a
-- non-zero cost it replaces s.v and sets s.exp (when the state is full again)
-- and s.dirty.

local function gcra(s, L, P, B, c, force)
  if B == 0 then B = L end
  local T = cdiv(P, L)
  local tau = T * B
  local t0 = max(s.v[1] or now, now)
  if c > 0 and not force and (c > B or t0 + c * T - now > tau) then
    local retry = -1
    if c <= B then retry = t0 + c * T - now - tau end
    return 0, fdiv(max(0, tau - (t0 - now)), T), t0 - now, retry
  end
  local nt = t0
  if c > 0 then
    nt = t0 + c * T
  elseif c < 0 then
    nt = max(t0 + c * T, now)
  end
  if c ~= 0 then
    s.v, s.exp, s.dirty = { nt }, nt, true
  end
  return 1, fdiv(max(0, tau - (nt - now)), T), nt - now, 0
end

local function fixed(s, L, P, c, force, stamp)
  local ws = fdiv(now, P) * P
  local fin = ws + P
  local count = 0
  if s.v[1] == ws then count = s.v[2] end
  if c > 0 and not force and count + c > L then
    local retry = fin - now
    if c > L then retry = -1 end
    local reset = 0
    if count > 0 then reset = fin - now end
    return 0, max(0, L - count), reset, retry
  end
  if c ~= 0 and not (stamp > 0 and c < 0 and fdiv(stamp, P) * P ~= ws) then
    count = max(0, count + c)
    s.v, s.exp, s.dirty = { ws, count }, fin, true
    if count == 0 then s.exp = now end
  end
  local reset = 0
  if count > 0 then reset = fin - now end
  return 1, max(0, L - count), reset, 0
end

local function window(s, L, P, c, force, stamp)
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
  local function after(prev, cur)
    local remaining = fdiv(max(0, L * 1000000 - (prev * w + cur * 1000000)), 1000000)
    local reset = 0
    if cur > 0 then
      reset = rem + P
    elseif prev > 0 then
      reset = rem
    end
    return remaining, reset
  end
  if c > 0 and not force and prev * w + (cur + c) * 1000000 > L * 1000000 then
    local retry = -1
    if c <= L then
      if cur + c <= L then
        local X = min(1000000, fdiv((L - cur - c) * 1000000, prev))
        local R = cdiv((X + 1) * Pm, 1000000) - 1
        retry = rem - ((R + 1) * 1000 - 1)
      else
        local X = min(1000000, fdiv((L - c) * 1000000, cur))
        local R = cdiv((X + 1) * Pm, 1000000) - 1
        if R >= Pm then
          retry = rem
        else
          retry = rem + P - ((R + 1) * 1000 - 1)
        end
      end
    end
    local remaining, reset = after(prev, cur)
    return 0, remaining, reset, retry
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
      cur = max(0, cur + c)
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
  local remaining, reset = after(prev, cur)
  return 1, remaining, reset, 0
end

local function logRuns(s, L, P, c, force, stamp)
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
    local reset = 0
    if k > 0 then reset = runs[#runs - 1] + P - now end
    return max(0, L - k), reset
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
    local remaining, reset = after(runs, k)
    return 0, remaining, reset, retry
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
        if stamp > 0 then break end
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
  local remaining, reset = after(runs, k)
  return 1, remaining, reset, 0
end

-- logText decides a sliding log kept as text (s.v = { value } or {}),
-- with the arithmetic of logRuns. Admissions, rejections and peeks scan only
-- the expired runs and, for a rejection's retry, the runs up to the one
-- whose expiry makes room; refunds go through logRuns.
local function logText(s, L, P, c, force, stamp)
  local raw = s.v[1]
  if c < 0 then
    local runs = {}
    if raw then
      for w in string.gmatch(string.match(raw, '^L %d+ %d+ (.*)$') or '', '%d+') do
        runs[#runs + 1] = tonumber(w)
      end
    end
    local t = { v = runs }
    local ok, remaining, reset, retry = logRuns(t, L, P, c, force, stamp)
    if t.dirty then
      local parts, k = {}, 0
      for j = 1, #t.v - 1, 2 do
        k = k + t.v[j + 1]
        parts[#parts + 1] = string.format('%.0f %.0f', t.v[j], t.v[j + 1])
      end
      local last = t.v[#t.v - 1] or now
      s.v, s.exp, s.dirty = { string.format('L %.0f %.0f ', k, last) .. table.concat(parts, ' ') }, t.exp, true
    end
    return ok, remaining, reset, retry
  end

  local k, last, pos = 0, now, 1
  if raw then
    local _, e, kk, ll = string.find(raw, '^L (%d+) (%d+) ')
    k, last, pos = tonumber(kk), tonumber(ll), e + 1
    while true do
      local _, e2, ts, n = string.find(raw, '^(%d+) (%d+) ?', pos)
      if ts == nil or tonumber(ts) + P > now then
        break
      end
      k, pos = k - tonumber(n), e2 + 1
    end
  end
  local reset = 0
  if k > 0 then reset = last + P - now end
  if c > 0 and not force and k + c > L then
    local retry = -1
    if c <= L then
      -- The unit at 0-based position k + c - L - 1 makes room when it expires.
      local idx, seen, p = k + c - L - 1, 0, pos
      retry = reset
      while true do
        local _, e, ts, n = string.find(raw, '^(%d+) (%d+) ?', p)
        if ts == nil then
          break
        end
        seen = seen + tonumber(n)
        if seen > idx then
          retry = tonumber(ts) + P - now
          break
        end
        p = e + 1
      end
    end
    return 0, max(0, L - k), reset, retry
  end
  if c > 0 then
    local live = ''
    if k > 0 then
      live = string.sub(raw, pos) .. ' '
    end
    k = k + c
    s.v = { string.format('L %.0f %.0f ', k, now) .. live .. string.format('%.0f %.0f', now, c) }
    s.exp, s.dirty, reset = now + P, true, P
  end
  return 1, max(0, L - k), reset, 0
end

-- decide runs request i's algorithm on s with cost c.
local function decide(s, i, c)
  local a = 4 + (i - 1) * 8
  local alg = ARGV[a]
  local L, P = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local force, stamp = ARGV[a + 5] == '1', tonumber(ARGV[a + 7])
  if alg == '0' then
    return gcra(s, L, P, tonumber(ARGV[a + 3]), c, force)
  elseif alg == '1' then
    return logText(s, L, P, c, force, stamp)
  elseif alg == '2' then
    return window(s, L, P, c, force, stamp)
  end
  return fixed(s, L, P, c, force, stamp)
end

local tags = { ['0'] = 'g', ['1'] = 'l', ['2'] = 'w', ['3'] = 'f' }
local per = 4
if withPeeks then per = 6 end
local out = { now, 0 }
local rejected = false
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 8
  local s = load(i, tags[ARGV[a]])
  local ok, remaining, reset, retry = decide(s, i, tonumber(ARGV[a + 4]))
  if ok == 0 and ARGV[a + 6] ~= '1' then rejected = true end
  local o = 2 + (i - 1) * per
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = ok, remaining, max(0, reset), retry
end

-- peek reports request i's key as it was before the call (cost 0 writes
-- nothing): what an admitted request reports when the call is rejected.
local function peek(i)
  local s = states[KEYS[i]]
  local _, remaining, reset = decide({ tag = s.tag, v = s.orig }, i, 0)
  return remaining, max(0, reset)
end

if withPeeks then
  for i = 1, #KEYS do
    local o = 2 + (i - 1) * per
    if out[o + 1] == 1 then
      out[o + 5], out[o + 6] = peek(i)
    else
      out[o + 5], out[o + 6] = out[o + 2], out[o + 3]
    end
  end
end

if rejected then
  out[2] = 1
  if not withPeeks then
    for i = 1, #KEYS do
      local o = 2 + (i - 1) * per
      if out[o + 1] == 1 then
        out[o + 2], out[o + 3] = peek(i)
      end
    end
  end
  return out
end
for _, key in ipairs(order) do
  local s = states[key]
  if s.dirty then
    if s.exp <= now then
      redis.call('DEL', key)
    else
      local value
      if s.tag == 'l' then
        value = s.v[1] -- a sliding log is kept as text
      else
        local parts = { s.tag }
        for j = 1, #s.v do
          parts[j + 1] = string.format('%.0f', s.v[j])
        end
        value = table.concat(parts, ' ')
      end
      local ttl = max(1, cdiv(s.exp - now, 1000), minTTL)
      redis.call('SET', key, value, 'PX', string.format('%.0f', ttl))
    end
  end
end
return out
