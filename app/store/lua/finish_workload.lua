-- finish_workload.lua: close a workload whose steps are all final: it leaves the active
-- set for the done index (retention deletes it after retention_age_s). Its final state is
-- its state as it is now, not as the planner read it: failed or cancelled stay; a running
-- one ends completed when every step completed, else failed (and only then is an event
-- appended). A record that is gone only leaves the active set.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:workload:{id}
-- KEYS[2]  P:workloads:active
-- KEYS[3]  P:workloads:done
-- KEYS[4]  P:events
-- ARGV[1]  workload id
-- ARGV[2]  '1' when every step completed, else '0'
-- ARGV[3]  now, unix s (as text: finished_at, the done index's score, the event's ts)
-- Returns the workload's final state, or '' when its record is gone.
local current = redis.call('HGET', KEYS[1], 'state')
redis.call('SREM', KEYS[2], ARGV[1])
if not current then return '' end
local final = current
if current ~= 'failed' and current ~= 'cancelled' then
  final = (ARGV[2] == '1') and 'completed' or 'failed'
end
redis.call('HSET', KEYS[1], 'state', final, 'finished_at', ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if current == 'running' then
  append_event(KEYS[4], '{"ts":' .. ARGV[3] .. ',"kind":"workload_' .. final .. '","workload":'
               .. cjson.encode(ARGV[1]) .. '}')
end
return final
