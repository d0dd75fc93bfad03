-- fn_hold.lua: a GPU worker marks a workload function live and itself one of its holders
-- (makespan.registry.publish), renewed every LIVE_TTL_S / 3.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:fn:live:{name}
-- KEYS[2]  P:fn:holders:{name}  (zset: holder id -> its expiry, server clock ms)
-- ARGV[1]  holder id (one per GPU worker process)
-- ARGV[2]  ttl_ms
-- Returns 1.
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], server_now_ms() + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SET', KEYS[1], '1', 'PX', ttl)
return 1
