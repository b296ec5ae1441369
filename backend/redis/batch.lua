
-- The decisions of a batch: several calls of one GCRA, one rolling-window or
-- one sliding-log request each, queued together for one node (one hash slot
-- on Cluster), decided in one script run, so that the command's overhead
-- and the read of TIME are paid once for all of them. Each is decided as
-- its lone call's script would (gcra, rolling and slidingLog, defined
-- above), in order, and answers on its own: a decision that fails (a key
-- holding another type, a write refused under maxmemory) is an error in its
-- place, and every other decision of the batch stands.
--
-- KEYS[i] the stored key of decision i; ARGV[1] minimum TTL ms, then 7
-- values per decision: now or "" (the server's TIME), algorithm (0 rolling
-- window, 1 sliding log, 4 gcra), limit, period µs, burst, cost, flags (1
-- force, 2 shadow, or their sum).
-- Reply: per decision, its lone call's reply {now, rejected, allowed,
-- remaining, reset µs, retry µs (-1 never), next µs}, or an error.
local minTTL = tonumber(ARGV[1])
local time
local out = {}
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 7
  local now = ARGV[a + 1]
  if now == '' then
    if time == nil then
      local t = redis.call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = time
  else
    now = tonumber(now)
  end
  local decide = rolling
  if ARGV[a + 2] == '4' then
    decide = gcra
  elseif ARGV[a + 2] == '1' then
    decide = slidingLog
  end
  local flags = ARGV[a + 7]
  local r = { pcall(decide, KEYS[i], now, minTTL, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), flags == '1' or flags == '3', flags == '2' or flags == '3') }
  if r[1] then
    r[1] = now
    out[i] = r
  else
    local e = r[2]
    if type(e) == 'table' then e = e.err end
    out[i] = redis.error_reply(tostring(e))
  end
end
return out
