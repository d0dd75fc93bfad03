-- agenda_reap.lua: reap an agenda entry whose lock is gone.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:agenda:{op}
-- KEYS[2]  P:agenda:index
-- KEYS[3]  P:agenda:{op}:lock
-- ARGV[1]  op id
-- Returns 1 (reaped) or 0 (its lock is held).
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
