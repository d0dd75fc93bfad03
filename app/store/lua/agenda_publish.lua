-- agenda_publish.lua: write an agenda entry (makespan.workers.agenda) only while the caller
-- owns its lock; planned_start is the server clock and expected_end = planned_start +
-- duration, so the holder's own clock never enters an entry.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:agenda:{op}
-- KEYS[2]  P:agenda:index
-- KEYS[3]  P:agenda:{op}:lock
-- ARGV[1]  op id
-- ARGV[2]  lock token
-- ARGV[3]  the entry's fields, JSON object
-- ARGV[4]  expected duration s
-- Returns {1, planned_start} or 0 (the lock is not the caller's).
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local start_s = tonumber(t[1]) + tonumber(t[2]) / 1000000
local f = cjson.decode(ARGV[3])
f['planned_start'] = string.format('%.6f', start_s)
f['expected_end'] = string.format('%.6f', start_s + tonumber(ARGV[4]))
redis.call('DEL', KEYS[1])
for k, v in pairs(f) do redis.call('HSET', KEYS[1], k, v) end
redis.call('ZADD', KEYS[2], tonumber(f['expected_end']), ARGV[1])
return {1, f['planned_start']}
