-- inherited_levels.lua: for each job, the highest level (0 = CRITICAL .. 3 = LOW; 4: none)
-- of the queued or delayed jobs that wait on it, at any depth of the P:awaited index.
-- Library: lib
-- Transitions: none
--
-- KEYS: none
-- ARGV[1]  P, the key prefix (P:awaited:{job}, P:job:{id})
-- ARGV[2]  most dependants walked per job (bounds the script)
-- ARGV[3..]  job ids
-- Returns one level per job id.
local prefix = ARGV[1]
local cap = tonumber(ARGV[2])
local rank = {CRITICAL = 0, HIGH = 1, NORMAL = 2, LOW = 3}
local out = {}
for i = 3, #ARGV do
  local best, seen, frontier, walked = 4, {}, {ARGV[i]}, 0
  while #frontier > 0 and walked < cap and best > 0 do
    local nxt = {}
    for _, j in ipairs(frontier) do
      for _, w in ipairs(redis.call('SMEMBERS', key_awaited(prefix, j))) do
        if not seen[w] and walked < cap then
          seen[w] = true
          walked = walked + 1
          local rec = redis.call('HMGET', key_job(prefix, w), 'priority', 'state')
          if rec[2] == 'queued' or rec[2] == 'delayed' then  -- the index also holds dependants that run
            local k = rank[rec[1] or '']
            if k and k < best then best = k end
            table.insert(nxt, w)
          end
        end
      end
    end
    frontier = nxt
  end
  out[#out + 1] = best
end
return out
