-- Independent decisions of one request each, for one node (one hash slot on
-- Cluster), in order, in one run; a lone call is a batch of one. A decision
-- that fails (another type, a write refused under maxmemory) is an error in
-- its place; the others stand. KEYS[i] decision i's key, then the once records. ARGV: minimum TTL
-- ms, the number of rules R, 4 per rule: algorithm (0 rolling window, 1
-- sliding log, 2 sliding window, 3 fixed window, 4 gcra, 5 concurrency),
-- limit, period µs, burst; then 6 per decision: its rule (1..R), now µs or
-- "" (TIME), cost, flags (1 force, 2 shadow, or their sum), the lease id
-- (concurrency) or a refund's stamp (0: none), once (0: none; lib.lua's onceKey). Reply, per
-- decision: rejected (or its error), allowed, remaining, reset µs, retry µs
-- (-1 never), next µs, stamp.
local uses = {} -- the rules' algorithms, whose functions lib.lua defines
for r = 0, tonumber(ARGV[2]) - 1 do uses[ARGV[3 + 4 * r]] = true end
-- lib.lua
local minTTL, nrules = tonum(ARGV[1]), tonum(ARGV[2])
local time, out = 0, { 0, 0, 0, 0, 0, 0, 0 } -- sized for one decision

local function one(i)
  local a = 2 + nrules * 4 + (i - 1) * 6
  local r = 2 + (tonum(ARGV[a + 1]) - 1) * 4
  local alg, now, flags = ARGV[r + 1], ARGV[a + 2], ARGV[a + 4]
  if now ~= '' then
    now = tonum(now)
  elseif time == 0 then
    time = serverTime()
    now = time
  else
    now = time
  end
  local op, raw, P = ops[alg], '', tonum(ARGV[r + 3])
  if alg ~= '1' and alg ~= '5' then raw = redis.call('GET', KEYS[i]) or '' end
  local s = op.load(KEYS[i], raw, now, minTTL)
  if op.anchor(s, now, P) then -- a clock behind the state: written whatever follows
    store(s, alg, now, minTTL)
    if alg ~= '1' then raw = redis.call('GET', KEYS[i]) or '' end
    s = op.load(KEYS[i], raw, now, minTTL)
  end
  local m, c, force = onceKey(KEYS[i], ARGV[a + 6]), tonum(ARGV[a + 3]), flags == '1' or flags == '3'
  local leave -- what m becomes: 't' a ticket, 'r' a record, 'd' nothing
  if m and c > 0 and not force then
    leave = 't'
  elseif m then
    local e = onceRead(m, now)
    if (c < 0 and e ~= 't') or (force and e == 'r') then c, m = 0, nil else leave = c < 0 and 'd' or 'r' end -- a peek
  end
  local ok, remaining, reset, retry, nx, placed = op.decide(s, now, tonum(ARGV[r + 2]), P,
    tonum(ARGV[r + 4]), c, force, alg == '5' and ARGV[a + 5] or tonum(ARGV[a + 5]))
  local rejected = 0
  if ok == 0 and flags ~= '2' and flags ~= '3' then
    rejected = 1 -- a shadow request blocks nothing
  elseif s.dirty then
    store(s, alg, now, minTTL)
  end
  if m and rejected == 0 then
    if leave == 'r' then onceSet(m, now, P, minTTL) elseif leave == 'd' then redis.call('DEL', m)
    elseif ok == 1 then ticketSet(m, now, P, minTTL) end
  end
  return rejected, ok, remaining, max(0, reset), retry, nx, placed
end

for i = 1, (#ARGV - 2 - 4 * nrules) / 6 do
  local o = 1 + (i - 1) * 7
  local ok, rejected, allowed, remaining, reset, retry, nx, placed = pcall(one, i)
  if not ok then
    if type(rejected) == 'table' then rejected = rejected.err end
    rejected, allowed, remaining, reset, retry, nx, placed = redis.error_reply(tostring(rejected)), 0, 0, 0, 0, 0, 0
  end
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = rejected, allowed, remaining, reset,
    retry, nx, placed
end
return out
