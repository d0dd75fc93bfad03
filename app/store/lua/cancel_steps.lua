-- cancel_steps.lua: cancel steps of a workload: queued steps (and delayed ones, waiting
-- out a retry backoff) at once; leased/running ones are asked to stop at their next phase
-- boundary (the GPU worker then releases their lease). Optionally the workload itself ends.
-- Library: lib
-- Transitions: queued -> cancelled, delayed -> cancelled
--
-- KEYS[1]  P:workload:{id}
-- KEYS[2]  P:events
-- KEYS[3]  P:queue:{level}  (a step whose record names a pool: that pool's queue, built from ARGV[4])
-- KEYS[4]  P:delayed
-- KEYS[5..4+n]  P:job:{id} of each step to cancel
-- ARGV[1]  now, unix s (finished_at)
-- ARGV[2]  reason
-- ARGV[3]  the workload's final state ('' = the workload's state is left as it is)
-- ARGV[4]  P, the key prefix (the reverse-dependency index, the finished index)
-- ARGV[5..4+n]  the job ids (as KEYS[5..])
-- Returns {cancelled now, cancel requested, the ids cancelled now...}.
local n = #KEYS - 4
local out = {0, 0}
for i = 1, n do
  local st = redis.call('HGET', KEYS[4 + i], 'state')
  if st == 'queued' or st == 'delayed' then
    local pool = redis.call('HGET', KEYS[4 + i], 'pool')
    if pool then  -- a step of a named pool is in that pool's queue (makespan.pools)
      redis.call('ZREM', key_queue(ARGV[4], redis.call('HGET', KEYS[4 + i], 'priority'), pool), ARGV[4 + i])
    else
      redis.call('ZREM', KEYS[3], ARGV[4 + i])
    end
    redis.call('ZREM', KEYS[4], ARGV[4 + i])
    awaited_drop(ARGV[4], ARGV[4 + i], redis.call('HGET', KEYS[4 + i], 'deps'))
    finish_job(ARGV[4], ARGV[4 + i], 'cancelled', ARGV[1], ARGV[2])
    append_event(KEYS[2], cjson.encode({ts = tonumber(ARGV[1]), kind = 'cancelled', job = ARGV[4 + i], reason = ARGV[2]}))
    out[1] = out[1] + 1
    table.insert(out, ARGV[4 + i])
  elseif st == 'leased' or st == 'running' then
    redis.call('HSET', KEYS[4 + i], 'cancel_requested', '1')
    out[2] = out[2] + 1
  end
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], 'reason', ARGV[2], 'finished_at', ARGV[1])
end
return out
