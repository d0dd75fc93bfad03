-- renew.lua: heartbeat renew of a lease, or the fencing check alone (ttl_ms 0).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:lease:{id}
-- KEYS[2]  P:leases
-- KEYS[3..] P:gpu:{uuid} of each GPU of the lease
-- ARGV[1]  lease id
-- ARGV[2]  fencing token
-- ARGV[3]  ttl_ms (0 = check only); the lease then expires at server clock + ttl_ms
-- Returns 1 while every GPU still names the lease and token, else 0 (nothing changed).
local want = ARGV[1] .. ':' .. ARGV[2]
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) ~= want then return 0 end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then renew_lease(KEYS[1], KEYS[2], {unpack(KEYS, 3)}, ARGV[1], ttl) end
return 1
