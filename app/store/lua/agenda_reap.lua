-- agenda_reap.lua: reap an agenda entry whose lock is gone (its holder died), and mark an
-- overrun incident raised for it as reaped (the observer then closes it as such, not as a
-- transition that ended).
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:agenda:{op}
-- KEYS[2]  P:agenda:index
-- KEYS[3]  P:agenda:{op}:lock
-- KEYS[4]  P:incidents:overruns   op id -> its overrun incident ids (the observer's)
-- ARGV[1]  op id
-- Returns 1 (reaped) or 0 (its lock is held).
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local reported = redis.call('HGET', KEYS[4], ARGV[1])
if reported and string.sub(reported, 1, 7) ~= 'reaped:' then
  redis.call('HSET', KEYS[4], ARGV[1], 'reaped:' .. reported)
end
return 1
