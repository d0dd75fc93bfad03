-- fail_workload.lua: fail a running workload (one of its steps failed beyond its retry
-- budget, or was cancelled). A workload that is no longer running (a cancel ended it
-- since the planner read it) is left as it is: the cancel stays a cancel.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:workload:{id}
-- KEYS[2]  P:events
-- ARGV[1]  reason
-- ARGV[2]  failed_at, unix s (as text)
-- ARGV[3]  the workload_failed event, JSON
-- Returns 1 when it failed the workload, else 0.
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed', 'reason', ARGV[1], 'failed_at', ARGV[2])
append_event(KEYS[2], ARGV[3])
return 1
