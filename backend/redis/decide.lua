-- One all-or-nothing decision: the requests of a Decide call (on Cluster, of
-- one hash slot), each seeing the state the previous one on its key would
-- write, written all or nothing.
-- KEYS[i] request i's key, then the once records. ARGV: now µs or "" (TIME), minimum TTL ms, "1"
-- for peeks (a call spanning Cluster slots), then 9 per request: algorithm
-- (see batch.lua), limit, period µs, burst (Concurrency: the lease id),
-- cost, force, shadow (0/1), stamp (µs, or 0), once (0: none).
-- Reply: {now, rejected, then per request allowed, remaining, reset µs,
-- retry µs (-1 never), next µs, stamp (at least 1 for a settlement whose once
-- the call applied) [, peek remaining, reset, next]}; in a rejected call the
-- admitted requests report the unchanged state, no stamp.
-- With peeks it ends, per request, with what the call did: for a string,
-- its value and PTTL before, 0 (nothing), 1 (set) or 2 (deleted), and the
-- value left; for a Concurrency key, "off at;" and the changed leases as
-- they were ("id score n", or "id" when absent, ","-separated), '', 3 when
-- any changed (else 0), and the same leases as left; then the request's
-- once entry as it was, "value,PTTL" ('' when absent or no once).
-- ARGV[3] = "u" puts such keys back where they still hold what the call
-- left (never another client's write): ARGV[5i-1..] is key i's action, value
-- left, value before, PTTL and the once entries the call applied to it as
-- they were ("id=value,PTTL" or "id=" when absent, space-separated), which
-- go back with it. Reply: per key, 1 when put back, else 0.
local uses = {} -- the requests' algorithms, whose functions lib.lua defines
if ARGV[3] ~= 'u' then for i = 0, (#ARGV - 3) / 9 - 1 do uses[ARGV[4 + 9 * i]] = true end end
-- lib.lua
local nk = ARGV[3] == 'u' and #KEYS or (#ARGV - 3) / 9 -- the requests
-- leaseList is "off at;" of the companion and the leases named in list
-- ("id ..." entries) as key holds them now, in the same form.
local function leaseList(key, list)
  local hkey, parts = companion(key), {}
  local h = redis.call('HMGET', hkey, '+', '@')
  for id in string.gmatch(list, '(%d+)[^,]*') do
    local e, n = redis.call('ZSCORE', key, id), redis.call('HGET', hkey, id)
    if e and n then parts[#parts + 1] = fmt('%s %d %d', id, tonum(e), tonum(n)) else parts[#parts + 1] = id end
  end
  return fmt('%s %s;', h[1] or '', h[2] or '') .. table.concat(parts, ',')
end

if ARGV[3] == 'u' then
  local out = {}
  for i, key in ipairs(KEYS) do
    local a = 5 * i - 1
    local action, after, old, x = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
    out[i] = 0
    if action == '3' then
      local hkey = companion(key)
      local off, at, entries = string.match(old, '^(%d+) (%d+);(.*)$')
      if leaseList(key, entries) == after then
        local count = tonum(redis.call('HGET', hkey, '#')) or 0
        for _, _, n in string.gmatch(string.match(after, ';(.*)$'), '(%d+) (%d+) (%d+)') do count = count - tonum(n) end
        for entry in string.gmatch(entries, '[^,]+') do
          local id, e, n = string.match(entry, '^(%d+) (%d+) (%d+)$')
          if id then
            redis.call('ZADD', key, e, id)
            redis.call('HSET', hkey, id, n)
            count = count + tonum(n)
          else
            redis.call('ZREM', key, entry)
            redis.call('HDEL', hkey, entry)
          end
        end
        local top, now = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES'), ARGV[1] == '' and serverTime() or tonum(ARGV[1])
        redis.call('HSET', hkey, '#', count, '+', off, '@', at)
        local exp = top[2] and tonum(top[2]) - tonum(off)
        if not exp then
          redis.call('DEL', hkey) -- no lease left: nor its companion
        elseif exp > now then -- both expire with the last lease
          local ttl = max(1, cdiv(exp - now, 1000), tonum(ARGV[2]))
          redis.call('PEXPIRE', key, ttl)
          redis.call('PEXPIRE', hkey, ttl)
        end
        out[i] = 1
      end
    else
      local cur = redis.call('GET', key)
      if (action == '2' and cur == false) or (action == '1' and cur == after) then
        if old == '' then redis.call('DEL', key) else redis.call('SET', key, old, 'PX', max(1, tonum(x))) end
        out[i] = 1
      end
    end
    if out[i] == 1 then -- its once entries as they were
      for id, v, t in string.gmatch(ARGV[a + 4], '(-?%d+)=(-?%d*),?(%d*)') do
        if v == '' or tonum(t) == nil or tonum(t) <= 0 then
          redis.call('DEL', onceKey(key, id))
        else
          redis.call('SET', onceKey(key, id), v, 'PX', t)
        end
      end
    end
  end
  return out
end

local now = ARGV[1] == '' and serverTime() or tonum(ARGV[1])
local minTTL, withPeeks = tonum(ARGV[2]), ARGV[3] == '1'

-- One MGET reads every state stored as one string (another type: absent).
local raws = {}
do
  local names, idx = {}, {}
  for i = 1, nk do
    local alg = ARGV[4 + (i - 1) * 9]
    if alg ~= '5' and (alg ~= '1' or withPeeks) then names[#names + 1], idx[#idx + 1] = KEYS[i], i end
  end
  local got = #names > 0 and redis.call('MGET', unpack(names)) or {}
  for j = 1, #idx do raws[idx[j]] = got[j] end
end

local states, order = {}, {}
local function state(i, alg)
  local key = KEYS[i]
  local s = states[key]
  if s == nil or s.alg ~= alg then
    if s == nil then order[#order + 1] = key end
    s = ops[alg].load(key, raws[i] or '', now, minTTL)
    s.alg, states[key] = alg, s
  end
  return s
end

-- A state that a clock behind it anchors is written first, and read again.
for i = 1, nk do
  local a = 4 + (i - 1) * 9
  local alg, key = ARGV[a], KEYS[i]
  if ops[alg].anchor(state(i, alg), now, tonum(ARGV[a + 2])) then
    store(states[key], alg, now, minTTL)
    for j = 1, nk do if KEYS[j] == key and raws[j] ~= nil then raws[j] = redis.call('GET', key) end end
    states[key] = ops[alg].load(key, raws[i] or '', now, minTTL)
    states[key].alg = alg
  end
end

-- run decides request i on s with cost c.
local function run(i, s, c)
  local a = 4 + (i - 1) * 9
  local x = ARGV[a] == '5' and ARGV[a + 3] or tonum(ARGV[a + 7])
  return ops[ARGV[a]].decide(s, now, tonum(ARGV[a + 1]), tonum(ARGV[a + 2]), tonum(ARGV[a + 3]), c, ARGV[a + 5] == '1', x)
end

local per = withPeeks and 9 or 6
local out, before, ttls = { now, 0 }, {}, {}
if withPeeks then -- before any request changes a state
  for i = 1, nk do
    local o, alg = 2 + (i - 1) * per, ARGV[4 + (i - 1) * 9]
    local _, remaining, reset, _, nx = run(i, state(i, alg), 0)
    out[o + 7], out[o + 8], out[o + 9] = remaining, max(0, reset), nx
    if alg ~= '5' then before[i], ttls[i] = raws[i] or '', redis.call('PTTL', KEYS[i]) end
  end
end
-- marks: the once entries the call's settlements leave ({e = 'r' a record or 'd' none, P}); tickets: its
-- reservations' tickets, and their periods, written when it ends (lib.lua's onceKey)
local rejected, marks, tickets, onces = false, {}, {}, {}
if withPeeks then -- the once entries as they were, for an undo
  for i = 1, nk do
    local m = onceKey(KEYS[i], ARGV[4 + (i - 1) * 9 + 8])
    if m and onces[m] == nil then
      local v = redis.call('GET', m)
      onces[m] = v and (v .. ',' .. redis.call('PTTL', m)) or ''
    end
  end
end
for i = 1, nk do
  local a = 4 + (i - 1) * 9
  local m, c, P = onceKey(KEYS[i], ARGV[a + 8]), tonum(ARGV[a + 4]), tonum(ARGV[a + 2])
  local reserve = m and c > 0 and ARGV[a + 5] ~= '1'
  if m and not reserve then
    local e = marks[m] and marks[m].e or onceRead(m, now)
    if (c < 0 and e ~= 't') or (ARGV[a + 5] == '1' and e == 'r') then c, m = 0, nil end -- a peek
  end
  local ok, remaining, reset, retry, nx, placed = run(i, state(i, ARGV[a]), c)
  if reserve then
    if ok == 1 then tickets[m] = P end
  elseif m then
    marks[m], placed = { e = c < 0 and 'd' or 'r', P = P }, max(placed, 1)
  end
  if ok == 0 and ARGV[a + 6] ~= '1' then rejected = true end
  local o = 2 + (i - 1) * per
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = ok, remaining, max(0, reset), retry, nx, placed
  if withPeeks and ok == 0 then out[o + 7], out[o + 8], out[o + 9] = remaining, max(0, reset), nx end
end

-- undo appends each request's undo values; written maps a key the call
-- wrote to what it left, 1 and the value, or 2 (deleted).
local function undo(written)
  if not withPeeks then return end
  for i = 1, nk do
    local a = 4 + (i - 1) * 9
    if ARGV[a] == '5' then
      local s, old, w = states[KEYS[i]], {}, 0
      for id, o in pairs(s.orig) do old[#old + 1] = (id .. ' ' .. o):gsub(' $', '') end
      old = table.concat(old, ',')
      if written[KEYS[i]] then w = 3 end -- its leases, or its last write's now
      out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = fmt('%d %d;', s.off, s.at or now) .. old, '', w,
        leaseList(KEYS[i], old)
    else
      local w = written[KEYS[i]] or { 0, '' }
      out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = before[i], ttls[i], w[1], w[2]
    end
    out[#out + 1] = onces[onceKey(KEYS[i], ARGV[a + 8])] or ''
  end
end

if rejected then
  out[2] = 1
  undo({})
  for i = 1, nk do
    local o = 2 + (i - 1) * per
    out[o + 6] = 0
    if out[o + 1] == 1 and withPeeks then
      out[o + 2], out[o + 3], out[o + 5] = out[o + 7], out[o + 8], out[o + 9]
    elseif out[o + 1] == 1 then
      local _, remaining, reset, _, nx = run(i, ops[ARGV[4 + (i - 1) * 9]].load(KEYS[i], raws[i] or '', now, minTTL), 0)
      out[o + 2], out[o + 3], out[o + 5] = remaining, max(0, reset), nx
    end
  end
  return out
end
local written = {}
for _, key in ipairs(order) do
  local s = states[key]
  if s.dirty then
    store(s, s.alg, now, minTTL)
    local v = withPeeks and s.alg ~= '5' and redis.call('GET', key)
    if withPeeks then written[key] = v and { 1, v } or { 2, '' } end -- a lease: any
  end
end
for m, v in pairs(marks) do if v.e == 'r' then onceSet(m, now, v.P, minTTL) else redis.call('DEL', m) end end
for m, P in pairs(tickets) do ticketSet(m, now, P, minTTL) end
undo(written)
return out
