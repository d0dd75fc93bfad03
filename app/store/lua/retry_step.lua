-- retry_step.lua: retry a failed workload step as a new job (the failed attempt's record
-- stays as it is, for its history and retention): the workload's step map and the deps of
-- every job still waiting on the failed attempt point at the new id, in the same step.
-- Library: lib
-- Transitions: new -> queued
--
-- KEYS[1]  P:workload:{id}
-- KEYS[2]  P:job:{new id}
-- KEYS[3]  P:queue:{level}
-- KEYS[4]  P:events
-- KEYS[5]  P:seq
-- KEYS[6]  P:planner:wake of the retry's pool (P:pool:{name}:planner:wake): another pool's
--          planner may be the one retrying it
-- KEYS[7]  P:planner:critical of the retry's pool (the critical lane's arrivals)
-- ARGV[1]  step name
-- ARGV[2]  the failed attempt's job id
-- ARGV[3]  the new job id
-- ARGV[4]  the new job's fields, JSON object (state queued)
-- ARGV[5]  the retried event, JSON
-- ARGV[6]  P, the key prefix (the reverse-dependency index, the dependants' records)
-- ARGV[7]  '1' when the step is CRITICAL: the new job is also pushed on KEYS[7] (last 256
--          kept), as submit.lua pushes a CRITICAL job
-- Returns 1, or 0 when the workload is not running or the step was already retried.
-- The dependants are the waiting members of the failed attempt's reverse-dependency set
-- (makespan.awaited, P:awaited:{old id}): the workload's later steps and any job submitted
-- with depends_on on it, queued or delayed (delay_s, a retry backoff) alike; in each one's
-- deps the old id becomes the new one, and it moves from the old id's set to the new id's.
-- The new job joins the index for its own deps.
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
local old_set = key_awaited(ARGV[6], ARGV[2])
for _, waiter in ipairs(redis.call('SMEMBERS', old_set)) do
  local wk = key_job(ARGV[6], waiter)
  local state = redis.call('HGET', wk, 'state')
  if state == 'queued' or state == 'delayed' then
    local deps = cjson.decode(redis.call('HGET', wk, 'deps') or '[]')
    for j, d in ipairs(deps) do
      if d == ARGV[2] then deps[j] = ARGV[3] end
    end
    redis.call('HSET', wk, 'deps', cjson.encode(deps))
    redis.call('SREM', old_set, waiter)
    redis.call('SADD', key_awaited(ARGV[6], ARGV[3]), waiter)
  end
end
append_event(KEYS[4], ARGV[5])
redis.call('RPUSH', KEYS[6], '1')
redis.call('LTRIM', KEYS[6], 0, 15)  -- the first 16: a release LPUSHed at the head stays
if ARGV[7] == '1' then
  redis.call('RPUSH', KEYS[7], ARGV[3])
  redis.call('LTRIM', KEYS[7], -256, -1)
end
return 1
