-- submit_workload.lua: write a validated workload and every one of its steps (jobs),
-- atomically.
-- Library: lib
-- Transitions: new -> queued
--
-- KEYS[1]  P:seq
-- KEYS[2]  P:queue:{level}  (a step whose fields name a pool: that pool's queue, built from ARGV[5])
-- KEYS[3]  P:events
-- KEYS[4]  P:workload:{id}
-- KEYS[5]  P:workloads
-- KEYS[6]  P:workloads:active
-- KEYS[7..6+n]  P:job:{id} of each step
-- KEYS[7+n..]  P:planner:wake (P:pool:{name}:planner:wake) of each pool a step is queued in,
--              once each: its planner plans the steps at once, as after a plain submit
-- ARGV[1]  n, the step count
-- ARGV[2]  workload id
-- ARGV[3]  the workload's fields, JSON object
-- ARGV[4]  now, unix s (the P:workloads score)
-- ARGV[5]  P, the key prefix (a step with deps joins the reverse-dependency index; pool queues)
-- ARGV[6..5+3n]  per step: job id, fields JSON (state queued), submitted event JSON
-- Returns 1, or 0 when a job id already exists (nothing written).
local n = tonumber(ARGV[1])
for i = 1, n do
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then return 0 end
end
hset_table(KEYS[4], cjson.decode(ARGV[3]))  -- two fields per step: chunked (lib)
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[2])
redis.call('SADD', KEYS[6], ARGV[2])
for i = 1, n do
  local base = 5 + (i - 1) * 3
  local seq = redis.call('INCR', KEYS[1])
  local fields = cjson.decode(ARGV[base + 2])
  fields['seq'] = seq
  hset_table(KEYS[6 + i], fields)
  fields['seq'] = nil
  awaited_add(ARGV[5], ARGV[base + 1], fields['deps'])
  if fields['pool'] then  -- a step routed to a named pool joins that pool's queue (makespan.pools)
    redis.call('ZADD', key_queue(ARGV[5], fields['priority'], fields['pool']), seq, ARGV[base + 1])
  else
    redis.call('ZADD', KEYS[2], seq, ARGV[base + 1])
  end
  append_event(KEYS[3], ARGV[base + 3])
end
for i = 7 + n, #KEYS do
  redis.call('RPUSH', KEYS[i], '1')
  redis.call('LTRIM', KEYS[i], 0, 15)  -- the first 16: a release LPUSHed at the head stays
end
return 1
