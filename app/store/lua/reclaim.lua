-- reclaim.lua: reclaim one expired lease (its holder stopped renewing): free its GPUs,
-- forget the lease, and requeue, delay, fail, cancel or complete its job.
-- Library: lib
-- Transitions: leased -> queued, running -> queued, leased -> delayed, running -> delayed,
--   leased -> completed, running -> completed, leased -> cancelled, running -> cancelled,
--   leased -> failed, running -> failed
--
-- KEYS[1]  P:lease:{id}
-- KEYS[2]  P:leases
-- KEYS[3]  P:running
-- KEYS[4]  P:events
-- ARGV[1]  lease id
-- ARGV[2]  now_ms, the caller's clock (event ts and finished_at only)
-- ARGV[3]  max attempts
-- ARGV[4]  P, the key prefix (the job, its queue, the lease's GPUs, phases, busy slot)
-- ARGV[5]  retry backoff s (0 = queue at once)
-- ARGV[6]  longest backoff s
-- Returns {0, 'live'} (not expired on the server clock), or {1, outcome, job id or ''} with
-- outcome in released (not a job lease, or its job had moved on), requeued, completed,
-- cancelled, failed.
-- The job's attempt counts only when a phase of the lease was claimed (P:phase:{lease} not
-- empty); otherwise it is queued again at once, attempts unchanged. A requeued job waits as
-- a delayed job (makespan.workers.delayed) when a retry backoff is set; its due time is on
-- the server clock, as is the expiry check.
local server_now_ms = server_now_ms()
local prefix = ARGV[4]
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > server_now_ms then return {0, 'live'} end
local L = hash_table(redis.call('HGETALL', KEYS[1]))
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
-- what is resident is unknown after a holder died mid-transition, unless the GPU key
-- expired and a newer lease already holds the GPU: then the marker is the new holder's
free_gpus(prefix, want, gpus, true, true)
local phases = key_phase(prefix, ARGV[1])
local executed = redis.call('HGET', phases, 'execute') == 'done'
-- an attempt counts only once a phase of it started (claimed it): a lease that expired
-- while no consumer was alive for its host (a Redis role change, an outage, a dead
-- worker) did not try the job and must not burn its attempts
local tried = redis.call('HLEN', phases) > 0
drop_lease(prefix, KEYS[1], KEYS[2], ARGV[1])
local job = L['job']
local outcome = 'released'
local now_s = tostring(tonumber(ARGV[2]) / 1000.0)
if job and L['kind'] == 'job' then
  local jk = key_job(prefix, job)
  redis.call('ZREM', KEYS[3], job)
  local state = redis.call('HGET', jk, 'state')
  if state == 'leased' or state == 'running' then
    local attempts = tonumber(redis.call('HGET', jk, 'attempts') or '0')
    if tried then attempts = redis.call('HINCRBY', jk, 'attempts', 1) end
    if executed then  -- its workload already ran to the end: never run it twice
      finish_job(prefix, job, 'completed', now_s, 'completed; lease reclaimed after execute')
      outcome = 'completed'
    elseif redis.call('HGET', jk, 'cancel_requested') == '1' then
      finish_job(prefix, job, 'cancelled', now_s, 'cancelled; lease reclaimed')
      outcome = 'cancelled'
    elseif tried and attempts >= tonumber(ARGV[3]) then
      finish_job(prefix, job, 'failed', now_s,
                 'lease expired: its GPU worker stopped renewing it (' .. attempts .. ' attempts)')
      outcome = 'failed'
    else
      local backoff = tonumber(ARGV[5] or '0') or 0
      if not tried then
        requeue_job(prefix, job,
                    'requeued: lease expired before any phase started (no consumer for its host); not an attempt')
      elseif backoff > 0 then
        local wait = math.min(backoff * 2 ^ (attempts - 1), tonumber(ARGV[6]))
        delay_job(prefix, job, server_now_ms / 1000.0 + wait,
                  'requeued: lease expired (holder lost); retry after ' .. wait .. ' s')
      else
        requeue_job(prefix, job, 'requeued: lease expired (holder lost)')
      end
      outcome = 'requeued'
    end
  end
end
local ev = {ts = tonumber(ARGV[2]) / 1000.0, kind = 'reclaimed', lease = ARGV[1], job = job, outcome = outcome, gpus = gpus,
            attempt_counted = tried,
            expired_at = tonumber(L['expires_ms'] or ARGV[2]) / 1000.0}
append_event(KEYS[4], cjson.encode(ev))
if outcome == 'requeued' or outcome == 'failed' or outcome == 'completed' then
  local ev2 = {ts = tonumber(ARGV[2]) / 1000.0, kind = outcome, job = job, lease = ARGV[1], reason = 'lease expired'}
  append_event(KEYS[4], cjson.encode(ev2))
end
return {1, outcome, job or ''}
