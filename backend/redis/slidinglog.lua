-- slidingLog decides one sliding-log request on its own key (not a Cluster
-- refund's undo, which carries a stamp and runs decide.lua): decide.lua's
-- sliding log read a record at a time (logStep), with nothing else around
-- it, as gcra.lua is GCRA's. Same arithmetic and stored value
-- (ALGORITHMS.md); the conformance suite and the differential test run
-- both. It runs as the lone call's script (lone.lua) and for the decisions
-- of a batch (batch.lua).
--
-- slidingLog(key, now, minimum TTL ms, limit, period µs, burst (unused),
-- cost, force, shadow) returns rejected, allowed, remaining, reset µs,
-- retry µs (-1 never), next µs.
--
-- The log is a header of slH bytes, "L2 k newest head fin", then records of
-- slR bytes, "t n" (n units admitted at t), the live ones in bytes
-- [head, fin): a decision reads the header, the expired records it drops
-- from the front and the ones its answer needs; an admission appends a
-- record (or adds to the newest) and rewrites the header, and the log is
-- rewritten compact once its dropped records outweigh its live ones. A
-- log in the previous layout ("L k newest t n ...") is rewritten in this
-- one first; any other value counts as absent.

local slH, slR = 59, 34
local slMax, slMin, slSub, slFmt = math.max, math.min, string.sub, string.format

local function slHeader(k, newest, head, fin)
  return slFmt('L2 %016d %016d %010d %010d\n', k, newest, head, fin)
end

local function slRecord(t, n)
  return slFmt('%016d %016d\n', t, n)
end

-- slAt is where the record at byte offset o of log lg starts in lg.chunk,
-- read up to 8 records at a time, forward (or, backward, ending at o).
local function slAt(lg, o, backward)
  if o < lg.at or o + slR > lg.at + #lg.chunk then
    local from = o
    if backward then from = slMax(lg.head, o - 7 * slR) end
    lg.at, lg.chunk = from, redis.call('GETRANGE', lg.key, from, slMin(from + 8 * slR, lg.fin) - 1)
  end
  return o - lg.at
end

-- slRec is the instant and units of the record at byte offset o of lg.
local function slRec(lg, o, backward)
  local p = slAt(lg, o, backward)
  return tonumber(slSub(lg.chunk, p + 1, p + 16)), tonumber(slSub(lg.chunk, p + 18, p + 33))
end

-- slUnit is the instant of the live unit at 0-based position idx of lg,
-- its live records starting at head, or now when they hold fewer (it is
-- one being added).
local function slUnit(lg, head, idx, now)
  local seen = 0
  for o = head, lg.fin - slR, slR do
    local t, n = slRec(lg, o)
    seen = seen + n
    if seen > idx then return t end
  end
  return now
end

-- slUpgrade rewrites a log of the previous layout in this one, keeping its
-- TTL, and returns its header; nil when it holds no run.
local function slUpgrade(key)
  local parts, k, newest, t = {}, 0, 0, nil
  local raw = redis.call('GET', key)
  for w in string.gmatch(string.match(raw, '^L %d+ %d+ (.*)$') or '', '%d+') do
    if t == nil then
      t = tonumber(w)
    else
      local n = tonumber(w)
      k, newest = k + n, t
      parts[#parts + 1] = slRecord(t, n)
      t = nil
    end
  end
  if #parts == 0 then return nil end
  local h = slHeader(k, newest, slH, slH + #parts * slR)
  redis.call('SET', key, h .. table.concat(parts), 'KEEPTTL')
  return h
end

-- slCommit writes lg's header after a change that leaves k units, the
-- newest at newest, in [head, fin): the log is rewritten compact when the
-- bytes before head (dropped records) and after fin (records taken back,
-- when trimmed) outweigh the live ones; it expires at exp.
local function slCommit(lg, k, newest, head, fin, trimmed, now, exp, minTTL)
  local ttl = slMax(1, math.floor((exp - now + 999) / 1000), minTTL)
  local waste = head - slH
  if trimmed then waste = waste + redis.call('STRLEN', lg.key) - fin end
  if waste > fin - head then
    local live = redis.call('GETRANGE', lg.key, head, fin - 1)
    redis.call('SET', lg.key, slHeader(k, newest, slH, slH + #live) .. live, 'PX', ttl)
  else
    redis.call('SETRANGE', lg.key, 0, slHeader(k, newest, head, fin))
    redis.call('PEXPIRE', lg.key, ttl)
  end
end

local function slidingLog(key, now, minTTL, L, P, _, c, force, shadow)
  local lg = { key = key, k = 0, newest = 0, head = slH, fin = slH, at = -1, chunk = '' }
  local stored = false
  local h = redis.call('GETRANGE', key, 0, slH - 1)
  if slSub(h, 1, 2) == 'L ' then h = slUpgrade(key) end
  if h and #h == slH and slSub(h, 1, 3) == 'L2 ' then
    lg.k, lg.newest = tonumber(slSub(h, 4, 19)), tonumber(slSub(h, 21, 36))
    lg.head, lg.fin = tonumber(slSub(h, 38, 47)), tonumber(slSub(h, 49, 58))
    stored = true
  end
  -- Drop the records whose units no longer count.
  local head, k = lg.head, lg.k
  while head < lg.fin do
    local p = slAt(lg, head)
    if tonumber(slSub(lg.chunk, p + 1, p + 16)) + P > now then break end
    head, k = head + slR, k - tonumber(slSub(lg.chunk, p + 18, p + 33))
  end
  local reset, nx = 0, 0
  if k > 0 then reset = lg.newest + P - now end

  if c > 0 and not force and k + c > L then
    local retry = -1
    if c <= L then retry = slUnit(lg, head, k + c - L - 1, now) + P - now end
    if k >= L then nx = slUnit(lg, head, k - L, now) + P - now end
    local rejected = 1
    if shadow then rejected = 0 end -- a shadow request blocks nothing
    return rejected, 0, slMax(0, L - k), reset, retry, nx
  end

  if c > 0 then
    if k + c >= L then nx = slUnit(lg, head, k + c - L, now) + P - now end
    if not stored then
      redis.call('SET', key, slHeader(c, now, slH, slH + slR) .. slRecord(now, c), 'PX',
        slMax(1, math.floor((P + 999) / 1000), minTTL))
      return 0, 1, slMax(0, L - c), P, 0, nx
    end
    local fin = lg.fin
    if k > 0 and lg.newest == now then
      -- Units of the same instant as the newest record join it.
      local _, n = slRec(lg, fin - slR, true)
      redis.call('SETRANGE', key, fin - slR, slRecord(now, n + c))
    else
      redis.call('SETRANGE', key, fin, slRecord(now, c))
      fin = fin + slR
    end
    k = k + c
    slCommit(lg, k, now, head, fin, false, now, now + P, minTTL)
    return 0, 1, slMax(0, L - k), P, 0, nx
  end

  if c < 0 then
    -- Take the newest units back, record by record from the end.
    local take, fin, newest = slMin(-c, k), lg.fin, now
    local nk = k - take
    if nk >= L then nx = slUnit(lg, head, nk - L, now) + P - now end
    while take > 0 do
      local _, n = slRec(lg, fin - slR, true)
      if n > take then
        redis.call('SETRANGE', key, fin - slR, slRecord(slRec(lg, fin - slR, true), n - take))
        take = 0
      else
        fin, take = fin - slR, take - n
      end
    end
    if nk == 0 then
      redis.call('DEL', key)
      return 0, 1, L, 0, 0, 0
    end
    newest = slRec(lg, fin - slR, true)
    slCommit(lg, nk, newest, head, fin, true, now, newest + P, minTTL)
    return 0, 1, slMax(0, L - nk), newest + P - now, 0, nx
  end

  if k >= L then nx = slUnit(lg, head, k - L, now) + P - now end
  return 0, 1, slMax(0, L - k), reset, 0, nx
end

local one = slidingLog -- the lone call's algorithm (lone.lua)
