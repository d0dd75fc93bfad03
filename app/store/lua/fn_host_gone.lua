-- fn_host_gone.lua: a fleet host's GPU worker does not hold these workload functions (it
-- stopped cleanly, started without them, or found a job of one it lacks): the host's mark in
-- each P:fn:hosts:{name} ends now, kept as a past holder's
-- (makespan.registry.function_hosts), so the planner places the functions' jobs on the
-- hosts whose marks are live. A mark another worker of the same host renews comes back at
-- its next renewal.
-- Library: lib
-- Transitions: none
--
-- KEYS[i]  P:fn:hosts:{name}
-- ARGV[1]  the fleet host
-- Returns the number of live marks it ended.
local ended_ms = server_now_ms() - 1
local ended = 0
for _, key in ipairs(KEYS) do
  local expires = redis.call('ZSCORE', key, ARGV[1])
  if expires and tonumber(expires) > ended_ms then
    redis.call('ZADD', key, ended_ms, ARGV[1])
    ended = ended + 1
  end
end
return ended
