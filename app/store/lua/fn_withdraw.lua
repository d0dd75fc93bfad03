-- fn_withdraw.lua: a GPU worker that stops cleanly withdraws as a holder of a workload
-- function; the function stops being live at once when no other holder's mark is current
-- (makespan.registry.withdraw), instead of when its TTL runs out.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:fn:live:{name}
-- KEYS[2]  P:fn:holders:{name}
-- ARGV[1]  holder id
-- Returns 1 when the function is no longer live, 0 when another holder keeps it.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', server_now_ms())
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
