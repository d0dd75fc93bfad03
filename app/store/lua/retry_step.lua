-- retry_step.lua: retry a failed workload step as a new job (the failed attempt's record
-- stays as it is, for its history and retention): the workload's step map and every queued
-- dependant's deps point at the new id, in the same step.
-- Library: lib
-- Transitions: new -> queued
--
-- KEYS[1]  P:workload:{id}
-- KEYS[2]  P:job:{new id}
-- KEYS[3]  P:queue:{level}
-- KEYS[4]  P:events
-- KEYS[5]  P:seq
-- KEYS[6..]  P:job:{id} of each dependant of the step
-- ARGV[1]  step name
-- ARGV[2]  the failed attempt's job id
-- ARGV[3]  the new job id
-- ARGV[4]  the new job's fields, JSON object (state queued)
-- ARGV[5]  the retried event, JSON
-- ARGV[6]  P, the key prefix (the reverse-dependency index)
-- ARGV[7..]  per dependant (as KEYS[6..]): its new deps, JSON list
-- Returns 1, or 0 when the workload is not running or the step was already retried.
-- The reverse-dependency index (makespan.awaited) follows: the new job joins it for its
-- deps, a queued dependant moves from the old id's set to the new id's.
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
local steps = cjson.decode(redis.call('HGET', KEYS[1], 'steps'))
if steps[ARGV[1]] ~= ARGV[2] then return 0 end
steps[ARGV[1]] = ARGV[3]
local hist = cjson.decode(redis.call('HGET', KEYS[1], 'history'))
table.insert(hist[ARGV[1]], ARGV[3])
redis.call('HSET', KEYS[1], 'steps', cjson.encode(steps), 'history', cjson.encode(hist), 'job:' .. ARGV[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'retries:' .. ARGV[1], 1)
local seq = redis.call('INCR', KEYS[5])
local fields = cjson.decode(ARGV[4])
local f = {}
for k, v in pairs(fields) do table.insert(f, k); table.insert(f, tostring(v)) end
table.insert(f, 'seq'); table.insert(f, tostring(seq))
redis.call('HSET', KEYS[2], unpack(f))
awaited_add(ARGV[6], ARGV[3], fields['deps'])
redis.call('ZADD', KEYS[3], seq, ARGV[3])
for i = 6, #KEYS do
  if redis.call('HGET', KEYS[i], 'state') == 'queued' then
    local waiter = redis.call('HGET', KEYS[i], 'id')
    awaited_drop(ARGV[6], waiter, redis.call('HGET', KEYS[i], 'deps'))
    redis.call('HSET', KEYS[i], 'deps', ARGV[i + 1])
    awaited_add(ARGV[6], waiter, ARGV[i + 1])
  end
end
append_event(KEYS[4], ARGV[5])
return 1
