-- instance_set_if_exists.lua: HSET fields of a registered endpoint instance only while its
-- hash exists: an instance unregistered meanwhile is not recreated half
-- (makespan.workers.drivers.registry).
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:instance:{id}
-- ARGV     field, value, field, value, ...
-- Returns 1 (written) or 0 (no such instance).
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], unpack(ARGV)) return 1 end
return 0
