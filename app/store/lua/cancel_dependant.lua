-- cancel_dependant.lua: cancel a queued job the planner will never run: its dependency
-- failed, or the fleet the planner runs now cannot hold it (it leaves the
-- reverse-dependency index), only while the planner still leads.
-- Library: lib
-- Transitions: queued -> cancelled
--
-- KEYS[1]  P:queue:{level}
-- KEYS[2]  P:job:{id}
-- KEYS[3]  P:planner:fence
-- KEYS[4]  P:events
-- ARGV[1]  job id
-- ARGV[2]  planner token
-- ARGV[3]  now, unix s (finished_at)
-- ARGV[4]  reason
-- ARGV[5]  the cancelled event, JSON
-- ARGV[6]  P, the key prefix (the reverse-dependency index, the finished index)
-- Returns 1 when cancelled, else 0.
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') ~= 'queued' then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
awaited_drop(ARGV[6], ARGV[1], redis.call('HGET', KEYS[2], 'deps'))
finish_job(ARGV[6], ARGV[1], 'cancelled', ARGV[3], ARGV[4])
append_event(KEYS[4], ARGV[5])
return 1
