-- begin_warm.lua: the warm path's first step (makespan.workers.warm): when every GPU of the
-- lease still names it and already holds the endpoint's instance, mark evict and
-- start_endpoint done, claim execute and set the job running, in one step; and read what
-- the job's execute needs: its spec, its attempt counters and, for a job of a workload
-- function, the endpoint instances registered on its GPUs.
-- Library: lib
-- Transitions: leased -> running
--
-- KEYS[1]  P:phase:{lease}
-- KEYS[2]  P:job:{id}
-- KEYS[3]  P:events
-- KEYS[4]  P:busy:{lease}
-- KEYS[5..4+n]      P:gpu:{uuid} of each GPU
-- KEYS[5+n..4+2n]   P:resident:{uuid} of each GPU
-- KEYS[5+2n] P:lease:{id}
-- KEYS[6+2n] P:leases
-- KEYS[7+2n..6+3n]  P:gpu_instances:{uuid} of each GPU (the instance registry's per-GPU index)
-- ARGV[1]  lease id
-- ARGV[2]  fencing token
-- ARGV[3]  n, the GPU count
-- ARGV[4]  instance value the GPUs must hold
-- ARGV[5]  started_at, unix s
-- ARGV[6]  job id
-- ARGV[7..11]  five phase events, JSON
-- ARGV[12] the lease's TTL, ms: on 'ok' the lease is renewed to server clock + TTL (as a
--          phase renews it as it starts; the message may have waited most of the TTL)
-- ARGV[13] P, the key prefix (the registry's P:instance:{id} hashes)
-- ARGV[14..] the workload functions whose definitions in the caller's registry name helper
--          endpoints (a job of one whose record names no helpers has them)
-- Returns {'ok', spec JSON or '', attempts, tries, instances} (the record's counters, '' when
-- unset; instances, for a job of a workload function (its record names one, 'fn'): the
-- HGETALL reply, field, value, ..., of every instance registered on any of the GPUs, by
-- id; else nil) or {why} with why in helpers (the job has helper endpoints: they start and
-- stop in their phases), stale, cold, replay, cancel; nothing is written then.
local n = tonumber(ARGV[3])
-- the job's helpers: those its record names (planned with it), else its function's
-- (makespan.workers.phases.PhaseRunner._helpers); checked first, as the caller did before
local helpers, fn = unpack(redis.call('HMGET', KEYS[2], 'helpers', 'fn'))
if helpers and helpers ~= '' then
  if #cjson.decode(helpers) > 0 then return {'helpers'} end
elseif fn and fn ~= '' then
  for i = 14, #ARGV do if ARGV[i] == fn then return {'helpers'} end end
end
local want = ARGV[1] .. ':' .. ARGV[2]
for i = 1, n do if redis.call('GET', KEYS[4 + i]) ~= want then return {'stale'} end end
for i = 1, n do if redis.call('GET', KEYS[4 + n + i]) ~= ARGV[4] then return {'cold'} end end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'replay'} end
if redis.call('HGET', KEYS[2], 'cancel_requested') == '1' then return {'cancel'} end
redis.call('HSET', KEYS[1], 'evict:claimed', '1', 'evict', 'done', 'start_endpoint:claimed', '1',
           'start_endpoint', 'done', 'execute:claimed', '1')
for i = 7, 11 do append_event(KEYS[3], ARGV[i]) end
redis.call('SET', KEYS[4], ARGV[6])
redis.call('HSET', KEYS[2], 'state', 'running', 'started_at', ARGV[5])
renew_lease(KEYS[5 + 2 * n], KEYS[6 + 2 * n], {unpack(KEYS, 5, 4 + n)}, ARGV[1], tonumber(ARGV[12]))
local spec, attempts, tries = unpack(redis.call('HMGET', KEYS[2], 'spec', 'attempts', 'tries'))
if not fn or fn == '' then return {'ok', spec or '', attempts or '', tries or ''} end
local ids = redis.call('SUNION', unpack(KEYS, 7 + 2 * n, 6 + 3 * n))
table.sort(ids)
local instances = {}
for _, id in ipairs(ids) do
  local h = redis.call('HGETALL', key_instance(ARGV[13], id))
  if #h > 0 then instances[#instances + 1] = h end
end
return {'ok', spec or '', attempts or '', tries or '', instances}
