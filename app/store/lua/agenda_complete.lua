-- agenda_complete.lua: delete an agenda entry if the caller wrote it and the lock is the
-- caller's or is gone.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:agenda:{op}
-- KEYS[2]  P:agenda:index
-- KEYS[3]  P:agenda:{op}:lock
-- ARGV[1]  op id
-- ARGV[2]  lock token
-- Returns 1 (deleted) or 0.
local lock = redis.call('GET', KEYS[3])
if lock and lock ~= ARGV[2] then return 0 end
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder and holder ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if lock then redis.call('DEL', KEYS[3]) end
return 1
