-- submit_workload.lua: write a validated workload and every one of its steps (jobs),
-- atomically.
-- Library: lib
-- Transitions: new -> queued
--
-- KEYS[1]  P:seq
-- KEYS[2]  P:events
-- KEYS[3]  P:workload:{id}
-- KEYS[4]  P:workloads
-- KEYS[5]  P:workloads:active
-- KEYS[6..5+n]  P:job:{id} of each step
-- KEYS[6+n..5+2n]  P:queue:{level} of each step (P:pool:{name}:queue:{level} for a step
--                  whose fields name a pool)
-- KEYS[6+2n..5+3n]  P:planner:critical of each step's pool (the critical lane's arrivals)
-- KEYS[6+3n..]  P:planner:wake (P:pool:{name}:planner:wake) of each pool a step is queued in,
--               once each: its planner plans the steps at once, as after a plain submit
-- ARGV[1]  n, the step count
-- ARGV[2]  workload id
-- ARGV[3]  the workload's fields, JSON object
-- ARGV[4]  now, unix s (the P:workloads score)
-- ARGV[5]  P, the key prefix (a step with deps joins the reverse-dependency index; each step counts
--          in P:stats:submits)
-- ARGV[6..5+4n]  per step: job id, fields JSON (state queued), submitted event JSON, and
--                '1' when it is CRITICAL without dependencies: it is also pushed on its
--                P:planner:critical (last 256 kept), as submit.lua pushes a CRITICAL job
-- Returns 1, or 0 when a job id already exists (nothing written).
local n = tonumber(ARGV[1])
for i = 1, n do
  if redis.call('EXISTS', KEYS[5 + i]) == 1 then return 0 end
end
hset_table(KEYS[3], cjson.decode(ARGV[3]))  -- two fields per step: chunked (lib)
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[2])
for i = 1, n do
  local base = 5 + (i - 1) * 4
  local job_id = ARGV[base + 1]
  local seq = redis.call('INCR', KEYS[1])
  local fields = cjson.decode(ARGV[base + 2])
  fields['seq'] = seq
  hset_table(KEYS[5 + i], fields)
  fields['seq'] = nil
  awaited_add(ARGV[5], job_id, fields['deps'])
  redis.call('HINCRBY', key_submit_counts(ARGV[5]), fields['priority'], 1)
  redis.call('ZADD', KEYS[5 + n + i], seq, job_id)
  append_event(KEYS[2], ARGV[base + 3])
  if ARGV[base + 4] == '1' then
    redis.call('RPUSH', KEYS[5 + 2 * n + i], job_id)
    redis.call('LTRIM', KEYS[5 + 2 * n + i], -256, -1)
  end
end
for i = 6 + 3 * n, #KEYS do
  redis.call('RPUSH', KEYS[i], '1')
  redis.call('LTRIM', KEYS[i], 0, 15)  -- the first 16: a release LPUSHed at the head stays
end
return 1
