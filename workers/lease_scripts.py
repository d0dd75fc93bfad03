"""The Lua scripts of the GPU leases (:mod:`makespan.workers.leases`), one per atomic operation.

Each script's comment gives its KEYS and ARGV. ``P`` is the key prefix; times in
``*_ms`` are unix milliseconds, in ``*_s`` seconds.

* :data:`SERVER_NOW_MS`: the prelude that reads the Redis server's clock (``TIME``) into
  ``server_now_ms``; every lease expiry is computed and compared on it (also used by
  :mod:`makespan.workers.delayed` and :mod:`makespan.workers.requests`).
* ``_ACQUIRE``: gang acquire (whole or not at all), acknowledging the job in the same step.
* ``_RENEW``: heartbeat renew, or the fencing check alone (``ttl_ms`` 0).
* ``_FENCED``: a list of writes applied only while the lease is current.
* ``_RECLAIM``: reclaim one expired lease (requeue, delay, fail or complete its job).
* ``_EXPIRED``: the ids of the leases expired on the server's clock.
* ``_PREEMPT``: preempt one job lease (its job requeued, not counted as an attempt).

Text only: :class:`makespan.workers.leases.LeaseStore` and :func:`makespan.workers.leases.preempt` run them.
"""

from __future__ import annotations

from makespan.awaited import DROP_LUA

# Lua prelude: ``server_now_ms``, the Redis server's clock in unix ms (one TIME call).
SERVER_NOW_MS = """
local server_t = redis.call('TIME')
local server_now_ms = tonumber(server_t[1]) * 1000 + math.floor(tonumber(server_t[2]) / 1000)
"""

# KEYS: fence, lease, leases, job, queue, running, planner_fence, events, gpu_owner,
#       gpu_1..gpu_n[, resident_1..resident_n]
# ARGV: lease_id, job_id, ttl_ms, now_ms (caller's clock: leased_at, running score only), holder,
#       lease JSON fields, planner_token, event JSON, job_state,
#       instance value ('' = no resident keys; else the reply says whether every GPU holds that instance),
#       key prefix (a leased job leaves the reverse-dependency index, makespan.awaited: it waits on nothing now)
# expires_ms = server clock + ttl_ms
# A GPU is busy while its gpu key exists, or while the lease gpu_owner names for it is
# still live in leases (expiry on the server clock in the future): a gpu key lost to
# eviction or a manual DEL never lets a second lease onto a GPU whose lease still runs.
_ACQUIRE = SERVER_NOW_MS + DROP_LUA + """
local n = #KEYS - 9
if ARGV[10] ~= '' then n = n / 2 end
if ARGV[7] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[7] then return {0, 'planner_fenced'} end
if ARGV[9] == 'queued' and not redis.call('ZSCORE', KEYS[5], ARGV[2]) then return {0, 'not_queued'} end
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
local flat = {'token', tostring(token), 'expires_ms', tostring(expires_ms)}
for k, v in pairs(fields) do table.insert(flat, k); table.insert(flat, tostring(v)) end
redis.call('HSET', KEYS[2], unpack(flat))
redis.call('ZADD', KEYS[3], expires_ms, ARGV[1])
if ARGV[9] == 'queued' then
  redis.call('ZREM', KEYS[5], ARGV[2])
  awaited_drop(ARGV[11], ARGV[2], redis.call('HGET', KEYS[4], 'deps'))
  redis.call('HSET', KEYS[4], 'state', 'leased', 'lease', ARGV[1], 'token', tostring(token),
             'leased_at', tostring(tonumber(ARGV[4]) / 1000.0))
  redis.call('ZADD', KEYS[6], ARGV[4], ARGV[2])
end
local ev = cjson.decode(ARGV[8]); ev['token'] = token
redis.call('XADD', KEYS[8], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
local warm = 0
if ARGV[10] ~= '' then
  warm = 1
  for i = 1, n do
    if redis.call('GET', KEYS[9 + n + i]) ~= ARGV[10] then warm = 0 end
  end
end
return {1, token, warm}
"""

# KEYS: lease, leases, gpu_1..gpu_n ; ARGV: lease_id, token, ttl_ms (0 = check only)
# expires_ms = server clock + ttl_ms
_RENEW = SERVER_NOW_MS + """
local want = ARGV[1] .. ':' .. ARGV[2]
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) ~= want then return 0 end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  for i = 3, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
  redis.call('ZADD', KEYS[2], server_now_ms + ttl, ARGV[1])
  redis.call('HSET', KEYS[1], 'expires_ms', tostring(server_now_ms + ttl))
end
return 1
"""

# Fenced write: verify the token on every GPU, then apply ops.
# KEYS: gpu_1..gpu_n, then the keys ops touch ; ARGV: lease_id, token, n_gpus, ops JSON
# ops: [[cmd, key_index(1-based into KEYS), args...], ...]  cmd in HSET, SET, DEL, ZREM, ZADD, XADD_E
_FENCED = """
local want = ARGV[1] .. ':' .. ARGV[2]
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= want then return 0 end
end
local ops = cjson.decode(ARGV[4])
for _, op in ipairs(ops) do
  local cmd = op[1]; local key = KEYS[op[2]]
  local args = {}
  for j = 3, #op do table.insert(args, op[j]) end
  if cmd == 'XADD_E' then
    redis.call('XADD', key, 'MAXLEN', '~', '1000000', '*', 'e', args[1])
  elseif cmd == 'DELIFEQ' then
    if redis.call('GET', key) == args[1] then redis.call('DEL', key) end
  else
    redis.call(cmd, key, unpack(args))
  end
end
return 1
"""

# Reclaim one expired lease (its holder stopped renewing). The job's attempt counts only
# when a phase of the lease was claimed (P:phase:{lease} not empty); otherwise it is queued
# again at once, attempts unchanged.
# A requeued job waits as a delayed job (makespan.workers.delayed) when a retry backoff is set.
# KEYS: lease, leases, running, events ; ARGV: lease_id, now_ms (caller's clock: event ts and
# finished_at only), max_attempts, prefix, retry backoff s (0 = queue at once), longest backoff s
# Expired means expires_ms <= the server clock; a backoff's due time is on the server clock too.
_RECLAIM = SERVER_NOW_MS + """
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > server_now_ms then return {0, 'live'} end
local lease = redis.call('HGETALL', KEYS[1])
local L = {}
for i = 1, #lease, 2 do L[lease[i]] = lease[i + 1] end
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
for _, g in ipairs(gpus) do
  local gk = ARGV[4] .. ':gpu:' .. g
  local cur = redis.call('GET', gk)
  if cur == want then redis.call('DEL', gk) end
  -- what is resident is unknown after a holder died mid-transition, unless the GPU key
  -- expired and a newer lease already holds the GPU: then the marker is the new holder's
  if cur == want or not cur then redis.call('DEL', ARGV[4] .. ':resident:' .. g) end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[4] .. ':busy:' .. ARGV[1])
local executed = redis.call('HGET', ARGV[4] .. ':phase:' .. ARGV[1], 'execute') == 'done'
-- an attempt counts only once a phase of it started (claimed it): a lease that expired
-- while no consumer was alive for its host (a Redis role change, an outage, a dead
-- worker) did not try the job and must not burn its attempts
local tried = redis.call('HLEN', ARGV[4] .. ':phase:' .. ARGV[1]) > 0
redis.call('DEL', ARGV[4] .. ':phase:' .. ARGV[1])
local job = L['job']
local outcome = 'released'
if job and L['kind'] == 'job' then
  local jk = ARGV[4] .. ':job:' .. job
  redis.call('ZREM', KEYS[3], job)
  local state = redis.call('HGET', jk, 'state')
  if state == 'leased' or state == 'running' then
    local attempts = tonumber(redis.call('HGET', jk, 'attempts') or '0')
    if tried then attempts = redis.call('HINCRBY', jk, 'attempts', 1) end
    if executed then  -- its workload already ran to the end: never run it twice
      redis.call('HSET', jk, 'state', 'completed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0),
                 'reason', 'completed; lease reclaimed after execute')
      outcome = 'completed'
    elseif redis.call('HGET', jk, 'cancel_requested') == '1' then
      redis.call('HSET', jk, 'state', 'cancelled', 'reason', 'cancelled; lease reclaimed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0))
      outcome = 'cancelled'
    elseif tried and attempts >= tonumber(ARGV[3]) then
      redis.call('HSET', jk, 'state', 'failed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0),
                 'reason', 'lease expired: its GPU worker stopped renewing it (' .. attempts .. ' attempts)')
      outcome = 'failed'
    else
      local prio = redis.call('HGET', jk, 'priority')
      local seq = redis.call('HGET', jk, 'seq')
      local backoff = tonumber(ARGV[5] or '0') or 0
      redis.call('HDEL', jk, 'lease', 'token')
      if not tried then
        redis.call('HSET', jk, 'state', 'queued',
                   'reason', 'requeued: lease expired before any phase started (no consumer for its host); not an attempt')
        redis.call('ZADD', ARGV[4] .. ':queue:' .. string.lower(prio), tonumber(seq), job)
      elseif backoff > 0 then
        local wait = math.min(backoff * 2 ^ (attempts - 1), tonumber(ARGV[6]))
        local due = server_now_ms / 1000.0 + wait
        redis.call('HSET', jk, 'state', 'delayed', 'not_before', tostring(due),
                   'reason', 'requeued: lease expired (holder lost); retry after ' .. wait .. ' s')
        redis.call('ZADD', ARGV[4] .. ':delayed', due, job)
      else
        redis.call('HSET', jk, 'state', 'queued', 'reason', 'requeued: lease expired (holder lost)')
        redis.call('ZADD', ARGV[4] .. ':queue:' .. string.lower(prio), tonumber(seq), job)
      end
      outcome = 'requeued'
    end
    if outcome ~= 'requeued' then  -- a final state: on the finished index (makespan.workers.retention)
      redis.call('ZADD', ARGV[4] .. ':finished', tonumber(ARGV[2]) / 1000.0, job)
    end
  end
end
local ev = {ts = tonumber(ARGV[2]) / 1000.0, kind = 'reclaimed', lease = ARGV[1], job = job, outcome = outcome, gpus = gpus,
            attempt_counted = tried,
            expired_at = tonumber(L['expires_ms'] or ARGV[2]) / 1000.0}
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
if outcome == 'requeued' or outcome == 'failed' or outcome == 'completed' then
  local ev2 = {ts = tonumber(ARGV[2]) / 1000.0, kind = outcome, job = job, lease = ARGV[1], reason = 'lease expired'}
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev2))
end
return {1, outcome, job or ''}
"""

# Lease ids whose expiry has passed on the server clock (candidates: reclaim checks again).
# KEYS: leases ; ARGV: none
_EXPIRED = SERVER_NOW_MS + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', server_now_ms)
"""

# Preempt one job lease: free its GPUs and put its job back in its queue with its
# original submission order (design notes, "Preemption"). Not counted as an attempt.
# Refused for a job whose execute phase is done (it only has to clear: never run it
# twice) and for a deposed planner. A job whose cancel was requested is cancelled.
# KEYS: lease, leases, running, events, planner_fence, finished
# ARGV: lease_id, now_ms, prefix, preemptor job id, planner token ('' = unchecked)
_PREEMPT = """
if ARGV[5] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[5] then return {0, 'planner_fenced'} end
local lease = redis.call('HGETALL', KEYS[1])
if #lease == 0 then return {0, 'gone'} end
local L = {}
for i = 1, #lease, 2 do L[lease[i]] = lease[i + 1] end
if L['kind'] ~= 'job' then return {0, 'not_a_job'} end
local phases = ARGV[3] .. ':phase:' .. ARGV[1]
if redis.call('HGET', phases, 'execute') == 'done' then return {0, 'executed'} end
local started = redis.call('HGET', phases, 'start_endpoint') == 'done'
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
for _, g in ipairs(gpus) do
  local gk = ARGV[3] .. ':gpu:' .. g
  if redis.call('GET', gk) == want then
    redis.call('DEL', gk)
    -- mid-transition, what is resident is unknown: forget it (the next start stops leftovers)
    if not started then redis.call('DEL', ARGV[3] .. ':resident:' .. g) end
  end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[3] .. ':busy:' .. ARGV[1])
redis.call('DEL', phases)
local job = L['job']
local jk = ARGV[3] .. ':job:' .. job
local now_s = tonumber(ARGV[2]) / 1000.0
redis.call('ZREM', KEYS[3], job)
local prio = redis.call('HGET', jk, 'priority')
local outcome = 'preempted'
if redis.call('HGET', jk, 'cancel_requested') == '1' then
  redis.call('HSET', jk, 'state', 'cancelled', 'reason', 'cancelled; preempted', 'finished_at', tostring(now_s))
  redis.call('ZADD', KEYS[6], now_s, job)
  outcome = 'cancelled'
else
  local seq = redis.call('HGET', jk, 'seq')
  redis.call('HSET', jk, 'state', 'queued', 'reason', 'preempted by ' .. ARGV[4])
  redis.call('HDEL', jk, 'lease', 'token')
  redis.call('HINCRBY', jk, 'preemptions', 1)
  redis.call('ZADD', ARGV[3] .. ':queue:' .. string.lower(prio), tonumber(seq), job)
end
local ev = {ts = now_s, kind = 'preempted', lease = ARGV[1], job = job, priority = prio, gpus = gpus,
            by = ARGV[4], outcome = outcome}
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
return {1, outcome}
"""
