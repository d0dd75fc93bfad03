-- write_wait_reasons.lua: write each waiting job's reason and ETA (makespan.wait_reasons);
-- only records still queued are written; the counts hash is replaced by the reasons
-- written (a job written twice counts once, with its last reason).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:planner:fence
-- KEYS[2]  P:planner:reasons   wait reason code -> queued jobs with it
-- KEYS[3]  P:planner:reasons:at the time of this write (server clock): a job whose wait_at is
--          older was not in it (not read by the tick: behind the batch, makespan.wait_reasons)
-- ARGV[1]  planner token ('' = unchecked)
-- ARGV[2]  P, the key prefix (P:job:{id})
-- ARGV[3..]  (job id, reason, detail, eta unix s or '', planned level or '') x n: the level
--           the planner plans it at when higher than its own (a dependant's it inherits:
--           written as `planned_priority`; '' deletes that field)
-- Returns how many were written (-1: fenced off).
local server_now_ms = server_now_ms()
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local at = string.format('%.3f', server_now_ms / 1000.0)
local n = 0
local last = {}
for i = 3, #ARGV, 5 do
  local jk = key_job(ARGV[2], ARGV[i])
  if redis.call('HGET', jk, 'state') == 'queued' then
    redis.call('HSET', jk, 'wait_reason', ARGV[i + 1], 'wait_detail', ARGV[i + 2], 'wait_eta', ARGV[i + 3],
               'wait_at', at)
    if ARGV[i + 4] ~= '' then
      redis.call('HSET', jk, 'planned_priority', ARGV[i + 4])
    else
      redis.call('HDEL', jk, 'planned_priority')
    end
    last[ARGV[i]] = ARGV[i + 1]
    n = n + 1
  end
end
local counts = {}
for _, reason in pairs(last) do counts[reason] = (counts[reason] or 0) + 1 end
redis.call('SET', KEYS[3], at)
redis.call('DEL', KEYS[2])
for reason, c in pairs(counts) do redis.call('HSET', KEYS[2], reason, c) end
return n
