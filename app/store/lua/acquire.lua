-- acquire.lua: gang-acquire GPUs for one lease (whole or not at all); for a job lease the
-- job is acknowledged (leaves its queue) in the same step.
-- Library: lib
-- Transitions: queued -> leased
--
-- KEYS[1]  P:fence          fencing-token counter
-- KEYS[2]  P:lease:{id}     the lease record (written; with token, expires_ms and granted_ms,
--                           the server clock's unix ms when it was granted)
-- KEYS[3]  P:leases         live leases, score = expiry (unix ms, server clock)
-- KEYS[4]  P:job:{job}      the job (P:job:- for a non-job lease)
-- KEYS[5]  P:queue:{level}  the job's queue
-- KEYS[6]  P:running        job ids holding a lease, score = lease time (unix ms, caller's clock)
-- KEYS[7]  P:planner:fence  planner fencing counter
-- KEYS[8]  P:events         events stream
-- KEYS[9]  P:gpu_owner      P:gpu:{uuid} -> lease id that last took it
-- KEYS[10..9+n]        P:gpu:{uuid} of each GPU
-- KEYS[10+n..9+2n]     P:resident:{uuid} of each GPU (only when ARGV[10] is not '')
-- KEYS[#KEYS]          P:hosts:cordoned (always the last key): a lease whose holder (ARGV[5], the
--                      host) is cordoned is refused, whatever the plan that asked for it read
-- ARGV[1]  lease id
-- ARGV[2]  job id
-- ARGV[3]  ttl_ms: the lease expires at server clock + ttl_ms
-- ARGV[4]  now_ms, the caller's clock (leased_at, running score only)
-- ARGV[5]  holder (the host of the GPUs for a planner's lease; '' unchecked)
-- ARGV[6]  lease record fields, JSON object
-- ARGV[7]  planner token ('' = unchecked)
-- ARGV[8]  the leased event, JSON (its token is added here)
-- ARGV[9]  'queued' for a job lease, else 'none' (a job lease deletes the job's reason: the
--          last requeue's or retry's, which the events stream keeps; a leased job has none;
--          and an earlier run's progress_* fields)
-- ARGV[10] instance value ('' = no resident keys; else the reply says whether every GPU holds it)
-- ARGV[11] P, the key prefix (unused: a leased job stays in the reverse-dependency index, lib.lua
--          finish_job drops it)
-- Returns {1, token, warm 0|1, first 0|1}, or {0, why[, gpu key[, owner]]} with why in
-- planner_fenced, not_queued, cordoned, busy, owned. first: a job lease is the job's first (its record
-- had no leased_at and no leased_before, lib.lua forget_lease: not a lease again after a preemption,
-- reclaim or retry); 0 for other leases.
-- A GPU is busy while its gpu key exists, or while the lease gpu_owner names for it is
-- still live in leases (expiry on the server clock in the future): a gpu key lost to
-- eviction or a manual DEL never lets a second lease onto a GPU whose lease still runs.
local server_now_ms = server_now_ms()
local n = #KEYS - 10
if ARGV[10] ~= '' then n = n / 2 end
if ARGV[7] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[7] then return {0, 'planner_fenced'} end
if ARGV[9] == 'queued' and not redis.call('ZSCORE', KEYS[5], ARGV[2]) then return {0, 'not_queued'} end
if ARGV[5] ~= '' and redis.call('HEXISTS', KEYS[#KEYS], ARGV[5]) == 1 then return {0, 'cordoned'} end
for i = 1, n do
  if redis.call('EXISTS', KEYS[9 + i]) == 1 then return {0, 'busy', KEYS[9 + i]} end
  local owner = redis.call('HGET', KEYS[9], KEYS[9 + i])
  if owner then
    local owner_expires = redis.call('ZSCORE', KEYS[3], owner)
    if owner_expires and tonumber(owner_expires) > server_now_ms then
      return {0, 'owned', KEYS[9 + i], owner}
    end
  end
end
local token = redis.call('INCR', KEYS[1])
local val = ARGV[1] .. ':' .. token
for i = 1, n do
  redis.call('SET', KEYS[9 + i], val, 'PX', ARGV[3])
  redis.call('HSET', KEYS[9], KEYS[9 + i], ARGV[1])
end
local fields = cjson.decode(ARGV[6])
local expires_ms = server_now_ms + tonumber(ARGV[3])
-- granted_ms: when the lease began on the server clock (the preemption bounds' minimum
-- runtime, and with the planner's planned_s field the lease's planned end: every planner,
-- whatever its own clock, measures the same time held and the same free time)
local flat = {'token', tostring(token), 'expires_ms', tostring(expires_ms), 'granted_ms', tostring(server_now_ms)}
for k, v in pairs(fields) do table.insert(flat, k); table.insert(flat, tostring(v)) end
redis.call('HSET', KEYS[2], unpack(flat))
redis.call('ZADD', KEYS[3], expires_ms, ARGV[1])
local first = 0
if ARGV[9] == 'queued' then
  if redis.call('HEXISTS', KEYS[4], 'leased_at') == 0 and redis.call('HEXISTS', KEYS[4], 'leased_before') == 0 then
    first = 1
  end
  redis.call('ZREM', KEYS[5], ARGV[2])
  -- gpus and host stay on the record after the lease ends (status of an ended job says where
  -- it ran); a requeue drops them with the lease (lib.lua forget_lease)
  redis.call('HSET', KEYS[4], 'state', 'leased', 'lease', ARGV[1], 'token', tostring(token),
             'leased_at', tostring(tonumber(ARGV[4]) / 1000.0), 'gpus', fields['gpus'] or '[]', 'host', ARGV[5])
  -- a requeue's or retry's reason described the wait that ends here (its event keeps it), and
  -- an earlier run's progress is not this run's (a preempted or retried function starts over)
  if first == 1 then
    redis.call('HDEL', KEYS[4], 'reason')
  else
    redis.call('HDEL', KEYS[4], 'reason', 'progress_done', 'progress_total', 'progress_note', 'progress_at')
  end
  redis.call('ZADD', KEYS[6], ARGV[4], ARGV[2])
end
local ev = cjson.decode(ARGV[8]); ev['token'] = token
append_event(KEYS[8], cjson.encode(ev))
local warm = 0
if ARGV[10] ~= '' then
  warm = 1
  for i = 1, n do
    if redis.call('GET', KEYS[9 + n + i]) ~= ARGV[10] then warm = 0 end
  end
end
return {1, token, warm, first}
