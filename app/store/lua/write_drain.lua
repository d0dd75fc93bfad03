-- write_drain.lua: record a drain check's counts, only while this planner leads (a planner
-- paused inside its check and deposed meanwhile must not overwrite the new leader's).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:planner:fence
-- KEYS[2]  P:drain
-- ARGV[1]  planner token ('' = unchecked)
-- ARGV[2..]  (field, value) x n, written with HSET; the field checks is incremented
-- Returns 1 (written) or -1 (fenced off: nothing written).
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('HINCRBY', KEYS[2], 'checks', 1)
return 1
