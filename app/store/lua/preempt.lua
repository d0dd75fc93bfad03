-- preempt.lua: preempt one job lease: free its GPUs and put its job back in its queue
-- with its original submission order (design notes, "Preemption"); not an attempt.
-- Refused for a job whose execute phase is done (it only has to clear: never run it
-- twice), for a job that is not leased or running (TRANSITIONS has no way from another
-- state to queued or cancelled by a preemption: nothing is changed, the lease stays with
-- its holder or the reclaim) and for a deposed planner. A job whose cancel was requested
-- is cancelled. Refused too when the preemptor's record exists and it is no longer queued
-- (leased meanwhile by another path, cancelled): the victim would lose its run for nothing.
-- The GPUs' resident markers are forgotten when the job was mid-transition or had started
-- helper endpoints (its clear phase stops those; a preempted job never gets there), so the
-- next lease there starts cold and stops what was left.
-- Library: lib
-- Transitions: leased -> queued, running -> queued, leased -> cancelled, running -> cancelled
--
-- KEYS[1]  P:lease:{id}
-- KEYS[2]  P:leases
-- KEYS[3]  P:running
-- KEYS[4]  P:events
-- KEYS[5]  P:planner:fence
-- ARGV[1]  lease id
-- ARGV[2]  now_ms, the caller's clock (event ts, finished_at)
-- ARGV[3]  P, the key prefix (the job, its queue, the lease's GPUs, phases, busy slot)
-- ARGV[4]  the preemptor's job id
-- ARGV[5]  planner token ('' = unchecked)
-- Returns {1, 'preempted' | 'cancelled', job id, the job's priority} or {0, why} with why in
-- planner_fenced, gone, not_a_job, not_leased, executed, preemptor_not_queued.
local prefix = ARGV[3]
if ARGV[5] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[5] then return {0, 'planner_fenced'} end
local preemptor_state = redis.call('HGET', key_job(prefix, ARGV[4]), 'state')
if preemptor_state and preemptor_state ~= 'queued' then return {0, 'preemptor_not_queued'} end
local lease = redis.call('HGETALL', KEYS[1])
if #lease == 0 then return {0, 'gone'} end
local L = hash_table(lease)
if L['kind'] ~= 'job' or not L['job'] then return {0, 'not_a_job'} end
local job_state = redis.call('HGET', key_job(prefix, L['job']), 'state')
if job_state ~= 'leased' and job_state ~= 'running' then return {0, 'not_leased'} end
local phases = key_phase(prefix, ARGV[1])
if redis.call('HGET', phases, 'execute') == 'done' then return {0, 'executed'} end
local started = redis.call('HGET', phases, 'start_endpoint') == 'done'
-- helper endpoints the job started beside its main one run on its GPUs until its clear
-- phase, which a preempted job never reaches: the GPUs do not hold just the resident
local helpers = redis.call('HGET', phases, 'helpers')
local extra = helpers ~= false and helpers ~= '[]'
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
repair_job_record(prefix, key_job(prefix, L['job']))  -- before the first write (lib)
-- mid-transition or beside helpers, what is resident is unknown: forget it (the next start
-- stops leftovers; a warm dispatch would not)
free_gpus(prefix, want, gpus, not started or extra, false)
drop_lease(prefix, KEYS[1], KEYS[2], ARGV[1])
local job = L['job']
local jk = key_job(prefix, job)
local now_s = tonumber(ARGV[2]) / 1000.0
redis.call('ZREM', KEYS[3], job)
local prio = redis.call('HGET', jk, 'priority')
local outcome = 'preempted'
if redis.call('HGET', jk, 'cancel_requested') == '1' then
  finish_job(prefix, job, 'cancelled', tostring(now_s), 'cancelled; preempted')
  outcome = 'cancelled'
else
  requeue_job(prefix, job, 'preempted by ' .. ARGV[4])
  redis.call('HINCRBY', jk, 'preemptions', 1)
end
-- the lease this preemption cut: its GPU worker, which learns of the loss later (after the
-- job may have been leased again and its reason rewritten), tells a preemption from a lost
-- lease by it (makespan.workers.phases PhaseRunner._preempted)
redis.call('HSET', jk, 'preempted_lease', ARGV[1])
local ev = {ts = now_s, kind = 'preempted', lease = ARGV[1], job = job, priority = prio, gpus = gpus,
            by = ARGV[4], outcome = outcome}
append_event(KEYS[4], cjson.encode(ev))
return {1, outcome, job, prio or ''}
