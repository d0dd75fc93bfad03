-- fn_hold.lua: a GPU worker marks a workload function live and itself one of its holders
-- (makespan.registry.publish), renewed every LIVE_TTL_S / 3.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:fn:live:{name}
-- KEYS[2]  P:fn:holders:{name}  (zset: holder id -> its expiry, server clock ms)
-- KEYS[3]  P:fn:hosts:{name}  (zset: fleet host -> its mark's expiry, server clock ms: the
--          hosts the planner may place the function's jobs on)
-- ARGV[1]  holder id (one per GPU worker process)
-- ARGV[2]  ttl_ms
-- ARGV[3]  the worker's fleet host ('' = not known: no host mark)
-- ARGV[4]  ms the host marks outlive their last renewal (makespan.registry.function_hosts
--          places a function's jobs on the hosts that had it last when every mark expired)
-- Returns 1.
local ttl = tonumber(ARGV[2])
local expires = server_now_ms() + ttl
redis.call('ZADD', KEYS[2], expires, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ttl)
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], expires, ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', expires - tonumber(ARGV[4]))  -- hosts gone that long
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
end
redis.call('SET', KEYS[1], '1', 'PX', ttl)
return 1
