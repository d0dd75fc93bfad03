-- lib.lua: the store's shared Lua library, prepended to every script whose header says
-- "Library: lib" (makespan.store.scripts loads it). Only `local` functions: a script
-- that does not call one pays nothing.
--
-- Keys: per-id keys (a job, a GPU, a lease's phases, ...) are built here, and only here,
-- from ONE prefix argument P (makespan.keys.Keys.script_prefix, e.g. "makespan"); each
-- builder mirrors the Keys method of the same name (a test compares them).
-- Times: *_ms unix milliseconds, *_s unix seconds; EVENTS_MAX_LEN, written in by the loader, is
-- makespan.settings.EVENTS_WRITE_TRIM_FACTOR x the process's Settings.events_max_len: a write
-- trims the events stream only past it; the planner's retention sweep trims to its own cap.
-- Job states written here: finish_job (completed | failed | cancelled), requeue_job (queued),
-- delay_job (delayed); the allowed transitions are makespan.store.states.TRANSITIONS.

local EVENTS_MAX_LEN = '__EVENTS_MAX_LEN__'

-- the Redis server's clock in unix ms (one TIME call): every lease expiry is on it
local function server_now_ms()
  local server_t = redis.call('TIME')
  return tonumber(server_t[1]) * 1000 + math.floor(tonumber(server_t[2]) / 1000)
end

local function key_job(prefix, job_id) return prefix .. ':job:' .. job_id end
-- a queue of the implicit pool (pool nil or '') or of a named pool (makespan.keys.Keys.for_pool)
local function key_scoped(prefix, pool)
  if pool and pool ~= '' then return prefix .. ':pool:' .. pool end
  return prefix
end
local function key_queue(prefix, priority_name, pool)
  return key_scoped(prefix, pool) .. ':queue:' .. string.lower(priority_name)
end
local function key_planner_wake(prefix, pool) return key_scoped(prefix, pool) .. ':planner:wake' end
local function key_planner_critical(prefix, pool) return key_scoped(prefix, pool) .. ':planner:critical' end
local function key_delayed(prefix) return prefix .. ':delayed' end
local function key_running(prefix) return prefix .. ':running' end
local function key_finished(prefix) return prefix .. ':finished' end
local function key_gpu(prefix, uuid) return prefix .. ':gpu:' .. uuid end
local function key_resident(prefix, uuid) return prefix .. ':resident:' .. uuid end
local function key_phase(prefix, lease_id) return prefix .. ':phase:' .. lease_id end
local function key_busy(prefix, lease_id) return prefix .. ':busy:' .. lease_id end
local function key_awaited(prefix, job_id) return prefix .. ':awaited:' .. job_id end
local function key_idem(prefix, idem) return prefix .. ':idem:' .. idem end
local function key_requests(prefix, job_id) return prefix .. ':requests:' .. job_id end
local function key_result(prefix, job_id) return prefix .. ':result:' .. job_id end
local function key_workloads_active(prefix) return prefix .. ':workloads:active' end
local function key_instance(prefix, instance_id) return prefix .. ':instance:' .. instance_id end
local function key_submit_counts(prefix) return prefix .. ':stats:submits' end
local function key_seq(prefix) return prefix .. ':seq' end

-- HSET every field of the Lua table tbl (field -> value, values written with tostring) on
-- key, at most HSET_CHUNK fields per call: unpack() of more than about 8000 values fails
-- ("too many results to unpack", Lua's C stack), which a workload of a few thousand steps
-- reaches (two fields per step in its record)
local HSET_CHUNK = 1000
local function hset_table(key, tbl)
  local flat = {}
  for k, v in pairs(tbl) do
    table.insert(flat, k); table.insert(flat, tostring(v))
    if #flat >= 2 * HSET_CHUNK then redis.call('HSET', key, unpack(flat)); flat = {} end
  end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
end

-- append one event (its JSON text) to the stream, trimmed past about EVENTS_MAX_LEN entries
local function append_event(stream_key, event_json)
  redis.call('XADD', stream_key, 'MAXLEN', '~', EVENTS_MAX_LEN, '*', 'e', event_json)
end

-- the reverse-dependency index (makespan.awaited): SADD / SREM job_id on P:awaited:{d}
-- for each d of the JSON list deps_json (nil or '' = none); SREM of the last member deletes the set
-- A dependency already compacted carries the retention TTL on its record, request records and
-- idempotency key:
-- it is lifted (PERSIST) while a job waits on it; the retention sweep, which still holds it in
-- P:retained, deletes it once nothing waits (expire_retained.lua)
-- the job ids of a record's `deps` (a JSON list; nil, '' or text that is not a JSON list of
-- strings: none): a record whose deps could not be decoded made a script raise after its first
-- writes (Redis keeps a script's writes made before its error), e.g. a cancel that had taken the
-- job out of its queue and left it `queued`
local function deps_list(deps_json)
  if not deps_json or deps_json == '' then return {} end
  local ok, deps = pcall(cjson.decode, deps_json)
  if not ok or type(deps) ~= 'table' then
    redis.log(redis.LOG_WARNING, 'makespan: a job record holds deps that are not a JSON list: ignored')
    return {}
  end
  local out = {}
  for _, d in ipairs(deps) do
    if type(d) == 'string' then table.insert(out, d) end
  end
  return out
end

local function awaited_add(prefix, job_id, deps_json)
  for _, d in ipairs(deps_list(deps_json)) do
    redis.call('SADD', key_awaited(prefix, d), job_id)
    redis.call('PERSIST', key_job(prefix, d))
    redis.call('PERSIST', key_requests(prefix, d))
    local idem = redis.call('HGET', key_job(prefix, d), 'idem')  -- written by compaction
    if idem and redis.call('GET', key_idem(prefix, idem)) == d then redis.call('PERSIST', key_idem(prefix, idem)) end
  end
end
local function awaited_drop(prefix, job_id, deps_json)
  for _, d in ipairs(deps_list(deps_json)) do redis.call('SREM', key_awaited(prefix, d), job_id) end
end

-- whether a job that has not ended waits on job_id (P:awaited:{job_id}): queued or delayed,
-- or leased or running (a preemption, a reclaim or a function retry puts it back, and its
-- dependencies' records and results are read again then); members that ended (a stale
-- entry: retention must not keep the job for them) are dropped
local function awaited_live(prefix, job_id)
  local key = key_awaited(prefix, job_id)
  local live = false
  for _, waiter in ipairs(redis.call('SMEMBERS', key)) do
    local state = redis.call('HGET', key_job(prefix, waiter), 'state')
    if state == 'queued' or state == 'delayed' or state == 'leased' or state == 'running' then
      live = true
    else
      redis.call('SREM', key, waiter)
    end
  end
  return live
end

-- wake the planner of each pool where a job waits on job_id (P:awaited:{job_id}; the record's
-- `pool`, none for the implicit pool), once each: a dependant in another pool than the GPUs
-- that ran job_id (whose release woke only their pool's planner) is planned at once too
local function wake_waiters_pools(prefix, job_id)
  local woken = {}
  for _, waiter in ipairs(redis.call('SMEMBERS', key_awaited(prefix, job_id))) do
    local pool = redis.call('HGET', key_job(prefix, waiter), 'pool') or ''
    if not woken[pool] then
      woken[pool] = true
      redis.call('RPUSH', key_planner_wake(prefix, pool), '1')
      redis.call('LTRIM', key_planner_wake(prefix, pool), 0, 15)
    end
  end
end

-- whether every job of the JSON list deps_json (nil or '' = none) has completed
local function deps_completed(prefix, deps_json)
  for _, d in ipairs(deps_list(deps_json)) do
    if redis.call('HGET', key_job(prefix, d), 'state') ~= 'completed' then return false end
  end
  return true
end

-- the CRITICAL dependants of job_id (P:awaited:{job_id}) that are queued and whose every
-- dependency has completed now join their pool's critical-lane arrivals
-- (P:planner:critical, the last 256 kept), as a CRITICAL submit does (submit.lua): the
-- leading planner's critical lane places each at once (makespan.workers.critical_lane)
local function push_released_critical(prefix, job_id)
  for _, waiter in ipairs(redis.call('SMEMBERS', key_awaited(prefix, job_id))) do
    local rec = redis.call('HMGET', key_job(prefix, waiter), 'priority', 'state', 'deps', 'pool')
    if rec[1] == 'CRITICAL' and rec[2] == 'queued' and deps_completed(prefix, rec[3]) then
      local arrivals = key_planner_critical(prefix, rec[4])
      redis.call('RPUSH', arrivals, waiter)
      redis.call('LTRIM', arrivals, -256, -1)
    end
  end
end

-- finish a job: its final state (completed | failed | cancelled), finish time (unix s, as
-- text) and reason; it leaves P:running and the reverse-dependency index, joins the
-- finished index (makespan.workers.retention) and wakes the planners of its dependants' pools
-- (a completed job: its CRITICAL dependants it released go to the critical lane too)
local function finish_job(prefix, job_id, state, finished_at_s, reason)
  -- it waits on nothing any more: it leaves the reverse-dependency index of its deps
  awaited_drop(prefix, job_id, redis.call('HGET', key_job(prefix, job_id), 'deps'))
  wake_waiters_pools(prefix, job_id)
  redis.call('ZREM', key_running(prefix), job_id)
  redis.call('HSET', key_job(prefix, job_id), 'state', state, 'finished_at', finished_at_s, 'reason', reason)
  if state == 'completed' then push_released_critical(prefix, job_id) end
  -- scored on the server clock, as retention compares it (a caller whose clock runs behind
  -- by more than the retention age had its job's summary deleted at the next sweep)
  redis.call('ZADD', key_finished(prefix), server_now_ms() / 1000.0, job_id)
end

-- a job that holds no lease any more (requeued or delayed): drop its lease, token and the
-- times of the lease it lost (a queued or delayed job shows no leased_at/started_at: they are
-- its current attempt's, as are the gpus and host it ran on); `leased_before` keeps that it was
-- leased (acquire.lua's first-lease test)
local function forget_lease(jk)
  if redis.call('HEXISTS', jk, 'leased_at') == 1 then redis.call('HSET', jk, 'leased_before', '1') end
  redis.call('HDEL', jk, 'lease', 'token', 'leased_at', 'started_at', 'gpus', 'host')
end

-- make an existing job record safe for a script to move before that script's first write: a
-- `priority` that is not a level name becomes NORMAL, a `seq` that is not a number a fresh one
-- (P:seq), a counter the scripts HINCRBY (`attempts`, `preemptions`, `fn_missing_backs`) that is
-- not an integer 0. A record missing one (a hand edit, a bug)
-- made reclaim, preempt, promote_delayed and reroute raise after they had freed the lease's
-- GPUs or taken the job out of its queue: the job was left `queued` in no queue, or with
-- no lease (Redis keeps a script's writes made before its error). Call it before any write.
local PRIORITY_NAMES = {CRITICAL = true, HIGH = true, NORMAL = true, LOW = true}
local function repair_job_record(prefix, jk)
  if redis.call('EXISTS', jk) == 0 then return end
  local rec = redis.call('HMGET', jk, 'priority', 'seq')
  local repaired = false
  if not PRIORITY_NAMES[rec[1] or ''] then
    redis.call('HSET', jk, 'priority', 'NORMAL'); repaired = true
  end
  local seq = tonumber(rec[2] or '')
  -- ZADD refuses NaN and the planner an infinite seq: a number Lua reads is not enough
  if not seq or seq ~= seq or seq == math.huge or seq == -math.huge or seq ~= math.floor(seq) then
    redis.call('HSET', jk, 'seq', tostring(redis.call('INCR', key_seq(prefix)))); repaired = true
  end
  for _, counter in ipairs({'attempts', 'preemptions', 'fn_missing_backs'}) do  -- HINCRBY'd
    local value = redis.call('HGET', jk, counter)
    if value and not string.match(value, '^%-?%d+$') then  -- HINCRBY takes an integer's digits only ('1.0' fails)
      redis.call('HSET', jk, counter, '0'); repaired = true
    end
  end
  if repaired then
    redis.log(redis.LOG_WARNING, 'makespan: repaired a job record missing a valid priority, seq or attempts: ' .. jk)
  end
end

-- put a job back in its priority queue (of its pool: the record's `pool`, none for the
-- implicit pool) at its submission seq; it holds no lease any more. A job of a named pool
-- also wakes that pool's planner (another pool's planner may be the one requeueing it).
-- reason nil: the reason field is left as it is. Returns the job's priority name.
local function requeue_job(prefix, job_id, reason)
  local jk = key_job(prefix, job_id)
  repair_job_record(prefix, jk)
  local rec = redis.call('HMGET', jk, 'priority', 'seq', 'pool')
  forget_lease(jk)
  if reason then
    redis.call('HSET', jk, 'state', 'queued', 'reason', reason)
  else
    redis.call('HSET', jk, 'state', 'queued')
  end
  redis.call('ZADD', key_queue(prefix, rec[1], rec[3]), tonumber(rec[2]), job_id)
  if rec[3] and rec[3] ~= '' then
    redis.call('RPUSH', key_planner_wake(prefix, rec[3]), '1')
    redis.call('LTRIM', key_planner_wake(prefix, rec[3]), 0, 15)
  end
  return rec[1]
end

-- make a job wait until due_s (unix s, server clock) on P:delayed; it holds no lease any more
local function delay_job(prefix, job_id, due_s, reason)
  local jk = key_job(prefix, job_id)
  forget_lease(jk)
  redis.call('HSET', jk, 'state', 'delayed', 'not_before', tostring(due_s), 'reason', reason)
  redis.call('ZADD', key_delayed(prefix), due_s, job_id)
end

-- free the GPUs of a lease: each P:gpu:{g} that still names it (want = lease_id .. ':' .. token)
-- is deleted; P:resident:{g} is forgotten when the GPU was freed here and forget_if_freed, or
-- when its key was already gone and forget_if_gone
local function free_gpus(prefix, want, gpus, forget_if_freed, forget_if_gone)
  for _, g in ipairs(gpus) do
    local gk = key_gpu(prefix, g)
    local cur = redis.call('GET', gk)
    local freed = cur == want
    if freed then redis.call('DEL', gk) end
    if (freed and forget_if_freed) or (not cur and forget_if_gone) then
      redis.call('DEL', key_resident(prefix, g))
    end
  end
end

-- renew a held lease to server clock + ttl_ms: its GPU keys' TTLs, its P:leases score and
-- its expires_ms (renew.lua's heartbeat, begin_warm.lua as a warm job starts); the caller
-- has checked that every GPU key still names the lease and token
local function renew_lease(lease_key, leases_key, gpu_keys, lease_id, ttl_ms)
  local expires_ms = server_now_ms() + ttl_ms
  for _, gpu_key in ipairs(gpu_keys) do redis.call('PEXPIRE', gpu_key, ttl_ms) end
  redis.call('ZADD', leases_key, expires_ms, lease_id)
  redis.call('HSET', lease_key, 'expires_ms', tostring(expires_ms))
end

-- forget a lease: its record, its P:leases entry, its busy slot and its phase hash
local function drop_lease(prefix, lease_key, leases_key, lease_id)
  redis.call('DEL', lease_key)
  redis.call('ZREM', leases_key, lease_id)
  redis.call('DEL', key_busy(prefix, lease_id))
  redis.call('DEL', key_phase(prefix, lease_id))
end

-- a hash reply (HGETALL) as a Lua table
local function hash_table(flat)
  local out = {}
  for i = 1, #flat, 2 do out[flat[i]] = flat[i + 1] end
  return out
end
