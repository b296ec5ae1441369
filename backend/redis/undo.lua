-- Puts back the keys a decide script wrote in one Redis Cluster slot when
-- another slot of the same call rejected it (cluster.go's refund): a key
-- that still holds what the call left in it gets back its value and TTL
-- from before the call, exactly. A key another client wrote since is left
-- alone; the client then gives back only the call's own units.
--
-- KEYS[i]      a key the call wrote
-- ARGV[4i-3..4i] what the call did to it (1 set, 2 deleted), the value it
--              set, the value before ('' when absent), its PTTL before (ms)
--
-- Reply: per key, 1 when put back, 0 when another client wrote it since.

local out = {}
for i, key in ipairs(KEYS) do
  local a = 4 * (i - 1)
  local action, value, old, ttl = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], tonumber(ARGV[a + 4])
  local cur = redis.call('GET', key)
  if (action == '2' and cur == false) or (action == '1' and cur == value) then
    if old == '' then
      redis.call('DEL', key)
    elseif ttl > 0 then
      redis.call('SET', key, old, 'PX', ttl)
    else
      redis.call('SET', key, old)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
