-- awaited_running.lua: the leased jobs (P:running) that some job not ended waits on
-- (makespan.awaited).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:running
-- ARGV[1]  P, the key prefix (P:awaited:{job})
-- Returns a list of job ids.
local out = {}
for _, j in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('EXISTS', key_awaited(ARGV[1], j)) == 1 then table.insert(out, j) end
end
return out
