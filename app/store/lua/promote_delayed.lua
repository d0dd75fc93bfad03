-- promote_delayed.lua: queue at most `limit` delayed jobs that are due on the server clock,
-- only while the planner still leads and only jobs still delayed (a cancelled one is just
-- dropped from P:delayed): idempotent, atomic, bounded.
-- Library: lib
-- Transitions: delayed -> queued
--
-- KEYS[1]  P:delayed        delayed job ids, score = due time (unix s, server clock)
-- KEYS[2]  P:planner:fence
-- KEYS[3]  P:events
-- ARGV[1]  event ts (caller's clock, unix s)
-- ARGV[2]  limit
-- ARGV[3]  P, the key prefix (each job and its queue)
-- ARGV[4]  planner token ('' = unchecked)
-- ARGV[5]  ahead_s: due by server clock + ahead_s (tests only, else '0')
-- Returns {queued count, next due time or '', server clock (unix s, as text)};
-- {-1, '', server clock} when the planner is fenced off.
local server_now_ms = server_now_ms()
local server_now_s = string.format('%.6f', server_now_ms / 1000.0)
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return {-1, '', server_now_s} end
local by = server_now_ms / 1000.0 + tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', by, 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  if redis.call('HGET', key_job(ARGV[3], id), 'state') == 'delayed' then
    local prio = requeue_job(ARGV[3], id, nil)
    local ev = {ts = tonumber(ARGV[1]), kind = 'promoted', job = id, priority = prio}
    append_event(KEYS[3], cjson.encode(ev))
    n = n + 1
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {n, nxt[2] or '', server_now_s}
