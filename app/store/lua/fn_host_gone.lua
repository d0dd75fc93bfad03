-- fn_host_gone.lua: a fleet host's GPU worker does not hold these workload functions any
-- more. ARGV[2] says how its host's mark in each P:fn:hosts:{name} ends:
--   'past': its worker held them and stopped cleanly: a live mark ends now and is kept as a
--           past holder's (makespan.registry.function_hosts waits for the last holders when
--           no mark is live: a restart of the only host with a function);
--   'drop': its worker does not register them (it started without them, or found a job of
--           one it lacks): the host is no holder at all, live, past or last, unless it is the
--           last host marked: then its mark ends now and is kept (a function no host has any
--           more is not "any host": with no live mark the planner keeps its jobs queued,
--           waiting_for_function, until a worker registers it).
-- Either way the planner places the functions' jobs on the hosts whose marks are live. A
-- mark another worker of the same host renews comes back at its next renewal.
-- Library: lib
-- Transitions: none
--
-- KEYS[i]  P:fn:hosts:{name}
-- ARGV[1]  the fleet host
-- ARGV[2]  'past' or 'drop'
-- Returns the number of marks it ended or dropped.
local ended_ms = server_now_ms() - 1
local ended = 0
for _, key in ipairs(KEYS) do
  local expires = redis.call('ZSCORE', key, ARGV[1])
  if expires then
    if ARGV[2] == 'drop' and redis.call('ZCARD', key) > 1 then
      redis.call('ZREM', key, ARGV[1])
      ended = ended + 1
    elseif tonumber(expires) > ended_ms then
      redis.call('ZADD', key, ended_ms, ARGV[1])
      ended = ended + 1
    end
  end
end
return ended
