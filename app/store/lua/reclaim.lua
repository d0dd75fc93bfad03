-- reclaim.lua: reclaim one expired lease (its holder stopped renewing): free its GPUs,
-- forget the lease, and requeue, delay, fail, cancel or complete its job. With a fencing
-- token (ARGV[7]) it is a hand-back instead: the holder gives up a lease that is still
-- current (its GPU worker shuts down, or it does not register the job's workload function
-- that another host's worker does: makespan.workers.phases), expired or not, and the job
-- goes the same way at once; a token no longer current writes nothing.
-- Library: lib
-- Transitions: leased -> queued, running -> queued, leased -> delayed, running -> delayed,
--   leased -> completed, running -> completed, leased -> cancelled, running -> cancelled,
--   leased -> failed, running -> failed
--
-- KEYS[1]  P:lease:{id}
-- KEYS[2]  P:leases
-- KEYS[3]  P:running
-- KEYS[4]  P:events
-- KEYS[5]  (hand-back only, optional) the planner wake list of the GPUs' pool
-- ARGV[1]  lease id
-- ARGV[2]  now_ms, the caller's clock (event ts and finished_at only)
-- ARGV[3]  max attempts
-- ARGV[4]  P, the key prefix (the job, its queue, the lease's GPUs, phases, busy slot)
-- ARGV[5]  retry backoff s (0 = queue at once)
-- ARGV[6]  longest backoff s
-- ARGV[7]  fencing token of a hand-back ('' or absent = the reclaim of an expired lease)
-- ARGV[8]  (hand-back only) the value pushed at the head of KEYS[5] (makespan.keys.WAKE_RELEASE)
-- ARGV[9]  (hand-back only) why: 'worker_shutdown' (default), 'function_missing',
--          'start_failed' (the job's start phase failed: an endpoint start or wake that did
--          not pass its health check, a process that exited, a helper that did not start) or
--          'worker_lost' (the GPU worker's pool process running its phase died: prefork)
-- ARGV[10] (function_missing only) the hand-backs of that cause after which the job fails
--          (its record's fn_missing_backs: a function registered only where the job cannot run)
-- ARGV[11] (start_failed, worker_lost) the error, for the job's reason
-- Returns {0, 'live'} (not expired on the server clock; a reclaim), {0, 'stale'} (the
-- token is no longer current on every GPU; a hand-back), or {1, outcome, job id or ''} with
-- outcome in released (not a job lease, or its job had moved on), requeued, completed,
-- cancelled, failed.
-- The job's attempt counts only when a phase of the lease was claimed (P:phase:{lease} not
-- empty) and the lease expired or its start failed (another hand-back counts none); otherwise it is queued again at
-- once, attempts unchanged. A requeued job waits as
-- a delayed job (makespan.workers.delayed) when a retry backoff is set; its due time is on
-- the server clock, as is the expiry check.
local server_now_ms = server_now_ms()
local prefix = ARGV[4]
local handed_back = (ARGV[7] or '') ~= ''
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if handed_back then
  if not score then return {0, 'stale'} end
elseif not score or tonumber(score) > server_now_ms then
  return {0, 'live'}
end
local L = hash_table(redis.call('HGETALL', KEYS[1]))
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
if handed_back then  -- fenced: the caller's token, current on every GPU of the lease
  if L['token'] ~= ARGV[7] then return {0, 'stale'} end
  for _, g in ipairs(gpus) do
    if redis.call('GET', key_gpu(prefix, g)) ~= want then return {0, 'stale'} end
  end
end
local cause = handed_back and 'handed back: its GPU worker shut down' or 'lease expired (holder lost)'
-- a hand-back's why: its event's cause, the requeued job's reason and the requeued event's reason
local back_cause = (ARGV[9] or '') ~= '' and ARGV[9] or 'worker_shutdown'
local back_texts = {
  worker_shutdown = {'requeued: handed back, its GPU worker shut down; not an attempt',
                     'handed back at worker shutdown'},
  function_missing = {'requeued: handed back, the GPU worker of its host does not register its workload '
                      .. 'function (a worker of another host does); not an attempt',
                      'handed back: its workload function is not registered on that host'},
  start_failed = {'requeued: its endpoint failed to start', 'handed back: its endpoint failed to start'},
  worker_lost = {'requeued: the GPU worker process running it died', 'handed back: the GPU worker process running it died'}}
local back_text = back_texts[back_cause] or back_texts.worker_shutdown
local phases = key_phase(prefix, ARGV[1])
local executed = redis.call('HGET', phases, 'execute') == 'done'
-- an attempt counts only once a phase of it started (claimed it): a lease that expired
-- while no consumer was alive for its host (a Redis role change, an outage, a dead
-- worker) did not try the job and must not burn its attempts
local tried = redis.call('HLEN', phases) > 0
-- what is resident is unknown after a holder died mid-transition, unless the GPU key
-- expired and a newer lease already holds the GPU: then the marker is the new holder's.
-- A lease none of whose phases started changed nothing on its GPUs: their markers stand
-- (a warm endpoint is not thrown away for a cold start)
if L['job'] and L['kind'] == 'job' then repair_job_record(prefix, key_job(prefix, L['job'])) end  -- before any write
free_gpus(prefix, want, gpus, tried, tried)
-- a hand-back is no attempt either (a preemption is none): the worker was asked to stop, the
-- job did not fail it; rolling restarts of the GPU workers must not use up its attempts.
-- A failed start is one, and so is the death of the pool process that ran it (the lease's
-- expiry would count it too, a TTL later): each is retried like a lost holder, and
-- max_attempts bounds a start that can never pass or a job that crashes its process
local start_failed = handed_back and (back_cause == 'start_failed' or back_cause == 'worker_lost')
local start_error = start_failed and (ARGV[11] or '') or ''
local counted = tried and (start_failed or not handed_back)
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
    if counted then attempts = redis.call('HINCRBY', jk, 'attempts', 1) end
    local backs = 0
    if handed_back and back_cause == 'function_missing' then
      backs = redis.call('HINCRBY', jk, 'fn_missing_backs', 1)
    end
    if executed then  -- its workload already ran to the end: never run it twice
      finish_job(prefix, job, 'completed', now_s, 'completed; lease reclaimed after execute')
      outcome = 'completed'
    elseif redis.call('HGET', jk, 'cancel_requested') == '1' then
      finish_job(prefix, job, 'cancelled', now_s, 'cancelled; lease reclaimed')
      outcome = 'cancelled'
    elseif backs > tonumber(ARGV[10] or '3') then
      finish_job(prefix, job, 'failed', now_s, 'its workload function is registered only on GPU workers that cannot '
                 .. 'run it (handed back ' .. backs .. ' times: their hosts have no room for its endpoint, or are in '
                 .. 'another pool)')
      outcome = 'failed'
    elseif start_failed and attempts >= tonumber(ARGV[3]) then
      local what = back_cause == 'worker_lost' and 'the GPU worker process running it died' or 'its endpoint failed to start'
      finish_job(prefix, job, 'failed', now_s, what .. ' (' .. attempts .. (attempts == 1 and ' attempt' or ' attempts')
                 .. '); last: ' .. start_error)
      outcome = 'failed'
    elseif counted and attempts >= tonumber(ARGV[3]) then
      finish_job(prefix, job, 'failed', now_s,
                 'lease expired: its GPU worker stopped renewing it (' .. attempts
                 .. (attempts == 1 and ' attempt)' or ' attempts)'))
      outcome = 'failed'
    else
      local backoff = tonumber(ARGV[5] or '0') or 0
      if start_failed then
        local why = back_text[1] .. ' (attempt ' .. attempts .. ' of ' .. ARGV[3] .. '): ' .. start_error
        if backoff > 0 then
          local wait = math.min(backoff * 2 ^ (attempts - 1), tonumber(ARGV[6]))
          delay_job(prefix, job, server_now_ms / 1000.0 + wait, why .. '; retry after ' .. wait .. ' s')
        else
          requeue_job(prefix, job, why)
        end
      elseif handed_back then
        requeue_job(prefix, job, back_text[1])
      elseif not tried then
        requeue_job(prefix, job, 'requeued: lease expired before any phase started (no consumer for its host); not an attempt')
      elseif backoff > 0 then
        local wait = math.min(backoff * 2 ^ (attempts - 1), tonumber(ARGV[6]))
        delay_job(prefix, job, server_now_ms / 1000.0 + wait,
                  'requeued: ' .. cause .. '; retry after ' .. wait .. ' s')
      else
        requeue_job(prefix, job, 'requeued: ' .. cause)
      end
      outcome = 'requeued'
    end
  end
end
local ev = {ts = tonumber(ARGV[2]) / 1000.0, kind = 'reclaimed', lease = ARGV[1], job = job, outcome = outcome, gpus = gpus,
            attempt_counted = counted and L['kind'] == 'job' and job ~= nil,  -- a restore has no attempts
            cause = handed_back and back_cause or 'lease_expired'}
if not handed_back then ev.expired_at = tonumber(L['expires_ms'] or ARGV[2]) / 1000.0 end
if start_failed then ev.error = start_error end
append_event(KEYS[4], cjson.encode(ev))
if outcome == 'requeued' or outcome == 'failed' or outcome == 'completed' or outcome == 'cancelled' then
  -- every end of the job has its event (a cancel requested while the lease was lost had none)
  local ev2 = {ts = tonumber(ARGV[2]) / 1000.0, kind = outcome, job = job, lease = ARGV[1],
               reason = outcome == 'cancelled' and 'cancelled; lease reclaimed'
                        or start_failed and (back_text[2] .. ': ' .. start_error)
                        or handed_back and back_text[2] or 'lease expired'}
  append_event(KEYS[4], cjson.encode(ev2))
end
if handed_back and KEYS[5] then  -- the worker, not the planner's tick, freed the GPUs: wake it
  redis.call('LPUSH', KEYS[5], ARGV[8])
  redis.call('LTRIM', KEYS[5], 0, 15)
end
return {1, outcome, job or ''}
