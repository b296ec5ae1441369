
-- The lone call: one request of the algorithm defined above (one), with
-- decide.lua's ARGV for one request and its reply.
--
-- KEYS[1] the stored key; ARGV: now or "", minimum TTL ms, peeks (always
-- "0" here), then algorithm, limit, period µs, burst, cost, force, shadow,
-- stamp (always 0 here).
-- Reply: {now, rejected, allowed, remaining, reset µs, retry µs (-1 never),
-- next µs}.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
return { now, one(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
  tonumber(ARGV[8]), ARGV[9] == '1', ARGV[10] == '1') }
