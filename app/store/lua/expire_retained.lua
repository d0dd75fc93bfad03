-- expire_retained.lua: delete one retained summary, its request records, its result and
-- its idempotency key (only if it still names this job), unless the job is a step of a
-- workload still running, or a job not ended still waits on it (P:awaited:{id}: its
-- dependants read its state and its result): then it moves to the back of the retained
-- index and is looked at again later.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:job:{id}
-- KEYS[2]  P:retained
-- ARGV[1]  job id
-- ARGV[2]  P, the key prefix (P:workloads:active, P:awaited, P:requests, P:result, P:idem)
-- ARGV[3]  now, unix s
-- Returns -1 (kept: its workload runs, or a job waits on it) or the DEL count of the record.
local wid = redis.call('HGET', KEYS[1], 'workload_id')
if (wid and redis.call('SISMEMBER', key_workloads_active(ARGV[2]), wid) == 1)
    or awaited_live(ARGV[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
  return -1
end
redis.call('DEL', key_requests(ARGV[2], ARGV[1]))
redis.call('DEL', key_result(ARGV[2], ARGV[1]))  -- makespan.results: a result goes with its summary
local idem = redis.call('HGET', KEYS[1], 'idem')
if idem then
  local ik = key_idem(ARGV[2], idem)
  if redis.call('GET', ik) == ARGV[1] then redis.call('DEL', ik) end
end
return redis.call('DEL', KEYS[1])
