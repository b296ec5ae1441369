-- The common call, alone: one GCRA request. It is decide.lua's gcra with
-- nothing else around it (no tables of states, no closures per algorithm),
-- because most limiters have one rule on a request and the general script
-- costs twice the Redis CPU of this one. The arithmetic and the stored value
-- (the bare tat) are decide.lua's and ALGORITHMS.md's; the conformance suite
-- runs both.
--
-- KEYS[1] the stored key; ARGV as decide.lua's for one request:
-- now or "", minimum TTL ms, peeks (always "0" here), then algorithm,
-- limit, period µs, burst, cost, force, shadow, stamp.
-- Reply: {now, rejected, allowed, remaining, reset µs, retry µs (-1 never),
-- next µs}.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

-- fdiv is floor(a / b) for integers a >= 0, b > 0, exact (see decide.lua).
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local L, P, B, c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if B == 0 then B = L end
local T = fdiv(P + L - 1, L)
local tau = T * B

local t0 = now
local raw = redis.call('GET', KEYS[1])
local tat = tonumber(raw or '') -- the bare tat; "g tat" before
if tat == nil and raw and string.sub(raw, 1, 2) == 'g ' then tat = tonumber(string.sub(raw, 3)) end
if tat then t0 = math.max(tat, now) end

if c > 0 and ARGV[9] ~= '1' and (c > B or t0 + c * T - now > tau) then
  local retry = -1
  if c <= B then retry = t0 + c * T - now - tau end
  local rejected = 1
  if ARGV[10] == '1' then rejected = 0 end -- a shadow request blocks nothing
  local remaining, nx = fdiv(math.max(0, tau - (t0 - now)), T), 0
  if remaining == 0 then nx = t0 + T - now - tau end
  return { now, rejected, 0, remaining, t0 - now, retry, nx }
end

local nt = t0
if c > 0 then
  nt = math.min(t0 + c * T, now + 4503599627370496) -- a forced charge saturates 2^52 µs ahead
elseif c < 0 then
  nt = math.max(t0 + c * T, now)
end
if c ~= 0 then
  if nt <= now then
    redis.call('DEL', KEYS[1])
  else
    -- Numbers as arguments: Redis writes an integer's digits exactly, and
    -- formatting them in Lua costs more than the rest of the script.
    local ttl = math.max(1, fdiv(nt - now + 999, 1000), tonumber(ARGV[2]))
    redis.call('SET', KEYS[1], nt, 'PX', ttl)
  end
end
local remaining, nx = fdiv(math.max(0, tau - (nt - now)), T), 0
if remaining == 0 then nx = nt + T - now - tau end
return { now, 0, 1, remaining, nt - now, 0, nx }
