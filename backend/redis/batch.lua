
-- The decisions of a batch: several calls of one GCRA, one rolling-window or
-- one sliding-log request each, queued together for one node (one hash slot
-- on Cluster), decided in one script run, so that the command's overhead
-- and the read of TIME are paid once for all of them. Each is decided as
-- its lone call's script would (gcra, rolling and slidingLog, defined
-- above), in order, and answers on its own: a decision that fails (a key
-- holding another type, a write refused under maxmemory) is an error in its
-- place, and every other decision of the batch stands.
--
-- KEYS[i] the stored key of decision i. ARGV: minimum TTL ms, the number of
-- rules R, then 4 values per rule: algorithm (0 rolling window, 1 sliding
-- log, 4 gcra), limit, period µs, burst; then 4 values per decision: its
-- rule (1..R), now µs or "" (the server's TIME), cost, flags (1 force, 2
-- shadow, or their sum).
-- Reply: {now (0 when no decision read TIME), then per decision rejected,
-- allowed, remaining, reset µs, retry µs (-1 never), next µs}; a decision
-- that failed has its error in place of rejected, and 0s.
local minTTL, nrules = tonumber(ARGV[1]), tonumber(ARGV[2])
local algs, limits, periods, bursts = {}, {}, {}, {}
for r = 1, nrules do
  local a = 2 + (r - 1) * 4
  local alg = ARGV[a + 1]
  if alg == '4' then
    algs[r] = gcra
  elseif alg == '1' then
    algs[r] = slidingLog
  else
    algs[r] = rolling
  end
  limits[r], periods[r], bursts[r] = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
end
local time = 0
local out = { 0 }
for i = 1, #KEYS do
  local a = 2 + nrules * 4 + (i - 1) * 4
  local r = tonumber(ARGV[a + 1])
  local now = ARGV[a + 2]
  if now == '' then
    if time == 0 then
      local t = redis.call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
      out[1] = time
    end
    now = time
  else
    now = tonumber(now)
  end
  local flags = ARGV[a + 4]
  local o = 2 + (i - 1) * 6
  local ok, rejected, allowed, remaining, reset, retry, nx = pcall(algs[r], KEYS[i], now, minTTL, limits[r], periods[r],
    bursts[r], tonumber(ARGV[a + 3]), flags == '1' or flags == '3', flags == '2' or flags == '3')
  if ok then
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = rejected, allowed, remaining, reset, retry, nx
  else
    if type(rejected) == 'table' then rejected = rejected.err end
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = redis.error_reply(tostring(rejected)), 0, 0, 0, 0, 0
  end
end
return out
