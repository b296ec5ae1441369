-- gcra decides one GCRA request on its own key: decide.lua's gcra with
-- nothing else around it (no tables of states, no closures per algorithm),
-- because most limiters have one rule on a request and the general script
-- costs twice the Redis CPU of this one. The arithmetic and the stored value
-- (the bare tat) are decide.lua's and ALGORITHMS.md's; the conformance suite
-- runs both. It runs as the lone call's script (lone.lua) and for the
-- decisions of a batch (batch.lua).
--
-- gcra(key, now, minimum TTL ms, limit, period µs, burst, cost, force,
-- shadow) returns rejected, allowed, remaining, reset µs, retry µs (-1
-- never), next µs.

local gcraMax, gcraMin = math.max, math.min

local function gcra(key, now, minTTL, L, P, B, c, force, shadow)
  if B == 0 then B = L end
  local T = exactDiv(P + L - 1, L)
  local tau = T * B

  local t0 = now
  local raw = redis.call('GET', key)
  local tat = tonumber(raw or '') -- the bare tat; "g tat" before
  if tat == nil and raw and string.sub(raw, 1, 2) == 'g ' then tat = tonumber(string.sub(raw, 3)) end
  if tat then t0 = gcraMax(tat, now) end

  if c > 0 and not force and (c > B or t0 + c * T - now > tau) then
    local retry = -1
    if c <= B then retry = t0 + c * T - now - tau end
    local rejected = 1
    if shadow then rejected = 0 end -- a shadow request blocks nothing
    local remaining, nx = exactDiv(gcraMax(0, tau - (t0 - now)), T), 0
    if remaining == 0 then nx = t0 + T - now - tau end
    return rejected, 0, remaining, t0 - now, retry, nx
  end

  local nt = t0
  if c > 0 then
    nt = gcraMin(t0 + c * T, now + 4503599627370496) -- a forced charge saturates 2^52 µs ahead
  elseif c < 0 then
    nt = gcraMax(t0 + c * T, now)
  end
  if c ~= 0 then
    if nt <= now then
      redis.call('DEL', key)
    else
      -- Numbers as arguments: Redis writes an integer's digits exactly, and
      -- formatting them in Lua costs more than the rest of the script.
      local ttl = gcraMax(1, exactDiv(nt - now + 999, 1000), minTTL)
      redis.call('SET', key, nt, 'PX', ttl)
    end
  end
  local remaining, nx = exactDiv(gcraMax(0, tau - (nt - now)), T), 0
  if remaining == 0 then nx = nt + T - now - tau end
  return 0, 1, remaining, nt - now, 0, nx
end

local one = gcra -- the lone call's algorithm (lone.lua)
