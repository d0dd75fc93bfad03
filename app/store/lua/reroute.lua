-- reroute.lua: move a queued job from the queue it is in to the same level's queue of another
-- pool (its pool's planner is gone for good, or does not serve its endpoint any more, or no
-- planner leads it: makespan.workers.pool_rehome), at its submission seq; its record names the
-- new pool (none for the implicit pool), so a later requeue puts it there too, and that pool's
-- planner is woken. Only while the moving planner leads, and only a job still queued in the
-- source queue (a planner that leased it meanwhile took it out: no double start).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  the source queue, P:queue:{level} or P:pool:{from}:queue:{level}
-- KEYS[2]  P:job:{id}
-- KEYS[3]  P:planner:fence   the moving planner's (its pool's)
-- KEYS[4]  P:events
-- ARGV[1]  job id
-- ARGV[2]  the moving planner's token
-- ARGV[3]  P, the key prefix (the destination queue and wake list)
-- ARGV[4]  the destination pool ('' = the implicit pool)
-- ARGV[5]  the rerouted event, JSON
-- Returns 1 when moved, else 0.
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
if redis.call('HGET', KEYS[2], 'state') ~= 'queued' then return 0 end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
repair_job_record(ARGV[3], KEYS[2])  -- before the first move (lib)
local rec = redis.call('HMGET', KEYS[2], 'priority', 'seq')
local pool = nil
if ARGV[4] ~= '' then pool = ARGV[4] end
local target = key_queue(ARGV[3], rec[1], pool)
if target == KEYS[1] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', target, tonumber(rec[2]), ARGV[1])
if pool then
  redis.call('HSET', KEYS[2], 'pool', pool)
else
  redis.call('HDEL', KEYS[2], 'pool')
end
redis.call('RPUSH', key_planner_wake(ARGV[3], pool), '1')
redis.call('LTRIM', key_planner_wake(ARGV[3], pool), 0, 15)
append_event(KEYS[4], ARGV[5])
return 1
