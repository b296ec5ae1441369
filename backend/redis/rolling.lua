-- rolling decides one rolling-window request on its own key (not a Cluster
-- refund's undo, which carries a stamp and runs decide.lua): decide.lua's
-- rolling window with nothing else around it, as gcra.lua is GCRA's. Same
-- arithmetic and stored value (ALGORITHMS.md); the conformance suite and
-- the differential test run both. It runs as the lone call's script
-- (lone.lua) and for the decisions of a batch (batch.lua).
--
-- rolling(key, now, minimum TTL ms, limit, period µs, burst (unused), cost,
-- force, shadow) returns rejected, allowed, remaining, reset µs, retry µs
-- (-1 never), next µs.
--
-- The value is "R2 W last S " (15 digits each), then the K+1 counts, 10
-- digits and a space each, the current bucket's first: an admission in the
-- bucket of the previous one rewrites S and that count, which are
-- adjacent, in place (SETRANGE), and leaves the expiry as it is, since it
-- depends only on the bucket (the newest count is not 0 before or after).
-- Every other write sets the whole value and its expiry. A value of the
-- previous layout ("R ", the counts oldest first) is read and rewritten in
-- this one.

local rollMax, rollMin, rollSub, rollFmt = math.max, math.min, string.sub, string.format

-- K, a count's saturation, header bytes, bytes per count.
local RK, RNMAX, RH, RW = 16, 4294967295, 51, 11
-- RZEROS is K zero counts; RFRESH formats a value whose older counts are
-- all 0 (a literal costs no string building).
local RZEROS = '0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 '
local RFRESH = 'R2 %015d %015d %015d %010d 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 0000000000 '

-- rollCounts is the counts of raw (a value of this layout, or nil) after a
-- shift of d buckets, oldest first: n[0] .. n[K].
local function rollCounts(raw, d)
  local n = {}
  for i = 0, RK do
    local p = RK - i - d -- where count i + d is stored
    if raw and p >= 0 then
      local o = RH + p * RW
      n[i] = tonumber(rollSub(raw, o + 1, o + 10))
    else
      n[i] = 0
    end
  end
  return n
end

-- rollWait is when the buckets still counting hold at most x of the S
-- units of n.
local function rollWait(n, S, b, W, now, x)
  local acc = 0
  for i = 0, RK do
    acc = acc + n[i]
    if S - acc <= x then return (b + i + 1) * W - now end
  end
end

local function rollAfter(n, S, b, W, now, L)
  local reset, nx = 0, 0
  if S > 0 then
    local h = RK
    while n[h] == 0 do h = h - 1 end
    reset = (b + h + 1) * W - now
  end
  if S >= L then nx = rollWait(n, S, b, W, now, L - 1) end
  return rollMax(0, L - S), reset, nx
end

-- rollValue is the value of counts n (oldest first) in bucket b.
local function rollValue(W, b, S, n)
  local parts = { rollFmt('R2 %015d %015d %015d ', W, b, S) }
  for i = RK, 0, -1 do parts[#parts + 1] = rollFmt('%010d ', n[i]) end
  return table.concat(parts)
end

-- rollUpgrade is a value of the previous layout in this one.
local function rollUpgrade(raw)
  local parts = { 'R2 ', rollSub(raw, 3, 50) }
  for i = RK, 0, -1 do
    local o = 50 + i * RW
    parts[#parts + 1] = rollSub(raw, o + 1, o + RW)
  end
  return table.concat(parts)
end

local function rolling(key, now, minTTL, L, P, _, c, force, shadow)
  local W = exactDiv(P + RK - 1, RK)
  local raw = redis.call('GET', key)
  local stored = false -- raw is a value of this layout, as stored
  if raw then
    if #raw == RH + (RK + 1) * RW and rollSub(raw, 1, 3) == 'R2 ' then
      stored = true
    elseif #raw == RH - 1 + (RK + 1) * RW and rollSub(raw, 1, 2) == 'R ' then
      raw = rollUpgrade(raw)
    else
      raw = nil -- another algorithm's state: absent
    end
  end
  local last, S = 0, 0
  if raw and tonumber(rollSub(raw, 4, 18)) == W then
    last, S = tonumber(rollSub(raw, 20, 34)), tonumber(rollSub(raw, 36, 50))
  else
    raw = nil
  end
  local b = rollMax(exactDiv(now, W), last) -- a clock that went back stays in bucket last
  local d = b - last
  if d > RK then raw, S = nil, 0 end
  if raw and d > 0 then
    -- S is the sum of the counts (ALGORITHMS.md): of the d oldest buckets
    -- left and the K+1-d kept, the fewer are read.
    local kept = d + d > RK + 1
    local from, to, x = RK - d + 1, RK, 0
    if kept then from, to = 0, RK - d end
    for p = from, to do
      local o = RH + p * RW
      x = x + tonumber(rollSub(raw, o + 1, o + 10))
    end
    if kept then S = x else S = S - x end
  end
  local top = 0 -- the current bucket's count
  if raw and d == 0 then top = tonumber(rollSub(raw, RH + 1, RH + 10)) end

  if c > 0 and not force and S + c > L then
    local n = rollCounts(raw, d)
    local retry = -1
    if c <= L then retry = rollWait(n, S, b, W, now, L - c) end
    local rejected = 1
    if shadow then rejected = 0 end -- a shadow request blocks nothing
    local remaining, reset, nx = rollAfter(n, S, b, W, now, L)
    return rejected, 0, remaining, reset, retry, nx
  end

  if c > 0 then
    local nt = rollMin(RNMAX, top + c)
    S = S + nt - top
    local reset, nx = (b + RK + 1) * W - now, 0
    if S >= L then
      local n = rollCounts(raw, d)
      n[RK] = nt
      nx = rollWait(n, S, b, W, now, L - 1)
    end
    local ttl = rollMax(1, exactDiv(reset + 999, 1000), minTTL)
    if stored and top > 0 then
      redis.call('SETRANGE', key, RH - 16, rollFmt('%015d %010d', S, nt))
      if minTTL > 0 then redis.call('PEXPIRE', key, ttl) end -- WithClock's
    else
      -- The older counts are the read ones, shifted by d; zero counts are
      -- cut from literals (every string Lua builds is hashed and collected).
      local v
      if raw == nil then
        v = rollFmt(RFRESH, W, b, S, nt)
      elseif d == 0 then
        v = rollFmt('R2 %015d %015d %015d %010d ', W, b, S, nt) .. rollSub(raw, RH + RW + 1, RH + (RK + 1) * RW)
      else
        v = rollFmt('R2 %015d %015d %015d %010d ', W, b, S, nt) .. rollSub(RZEROS, 1, (d - 1) * RW)
          .. rollSub(raw, RH + 1, RH + (RK - d + 1) * RW)
      end
      redis.call('SET', key, v, 'PX', ttl)
    end
    return 0, 1, rollMax(0, L - S), reset, 0, nx
  end

  local n = rollCounts(raw, d)
  if c < 0 then -- take the units back from the newest bucket down
    local g = -c
    for i = RK, 0, -1 do
      if g == 0 then break end
      local t = rollMin(g, n[i])
      n[i], S, g = n[i] - t, S - t, g - t
    end
  end
  local remaining, reset, nx = rollAfter(n, S, b, W, now, L)
  if c < 0 and S == 0 then
    redis.call('DEL', key)
  elseif c < 0 then
    redis.call('SET', key, rollValue(W, b, S, n), 'PX', rollMax(1, exactDiv(reset + 999, 1000), minTTL))
  end
  return 0, 1, remaining, reset, 0, nx
end

local one = rolling -- the lone call's algorithm (lone.lua)
