-- drop_stale.lua: remove a queue entry whose job is no longer queued, only while the
-- planner still leads.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:queue:{level}
-- KEYS[2]  P:job:{id}
-- KEYS[3]  P:planner:fence
-- ARGV[1]  job id
-- ARGV[2]  planner token
-- Returns 1 when the entry was removed, else 0.
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') == 'queued' then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
