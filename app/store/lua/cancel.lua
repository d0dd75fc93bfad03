-- cancel.lua: cancel one job: a queued or delayed job at once; a leased or running one is
-- asked to stop (cancel_requested), its GPU worker ends it at its next phase boundary.
-- Library: lib
-- Transitions: queued -> cancelled, delayed -> cancelled
--
-- KEYS[1]  P:job:{id}
-- KEYS[2]  P:queue:{level}
-- KEYS[3]  P:events
-- KEYS[4]  P:delayed
-- ARGV[1]  job id
-- ARGV[2]  the cancelled event, JSON
-- ARGV[3]  now, unix s (finished_at)
-- ARGV[4]  P, the key prefix (the reverse-dependency index, the finished index)
-- Returns 'missing', 'cancelled_now' (this call cancelled it), 'cancel_requested' (this call
-- asked it to stop), 'cancel_requested_before' (an earlier call had asked already), or the
-- job's final state ('cancelled' when an earlier call or path cancelled it).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'queued' or state == 'delayed' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  awaited_drop(ARGV[4], ARGV[1], redis.call('HGET', KEYS[1], 'deps'))
  finish_job(ARGV[4], ARGV[1], 'cancelled', ARGV[3], 'cancelled while ' .. state)
  append_event(KEYS[3], ARGV[2])
  return 'cancelled_now'
end
if state == 'leased' or state == 'running' then
  if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 'cancel_requested_before' end
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'cancel_requested'
end
return state
