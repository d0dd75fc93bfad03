-- compact_finished.lua: compact one finished job: keep its summary fields, drop the rest,
-- set TTLs (makespan.workers.retention).
-- Library: lib
-- Transitions: none
-- Requires: completed | failed | cancelled
--
-- KEYS[1]  P:job:{id}
-- KEYS[2]  P:retained       retained summaries, score = finish time (unix s)
-- KEYS[3]  P:retention      tally of finished jobs by final state
-- ARGV[1]  job id
-- ARGV[2]  finished_at, unix s
-- ARGV[3]  ttl_s of the summary, its request records and its idempotency key
-- ARGV[4]  P, the key prefix (P:idem, P:workloads:active, P:awaited, P:requests)
-- ARGV[5..]  the summary fields kept
-- Returns 1 (compacted), 0 (no record), -1 (not finished yet: it stays on P:finished, the next
-- sweep retries). A compacted or missing job leaves P:finished here, in the same step, so a
-- sweep whose round trip fails loses none.
local R = hash_table(redis.call('HGETALL', KEYS[1]))
if next(R) == nil then
  redis.call('ZREM', key_finished(ARGV[4]), ARGV[1])
  return 0
end
local state = R['state']
if state ~= 'completed' and state ~= 'failed' and state ~= 'cancelled' then return -1 end
local idem = R['idem']
if not idem and R['spec'] then
  local ok, spec = pcall(cjson.decode, R['spec'])
  if ok and type(spec) == 'table' and type(spec['idempotency_key']) == 'string' then idem = spec['idempotency_key'] end
end
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
local drop = {}
for k, _ in pairs(R) do if not keep[k] then table.insert(drop, k) end end
if #drop > 0 then redis.call('HDEL', KEYS[1], unpack(drop)) end
if idem then redis.call('HSET', KEYS[1], 'idem', idem) end
-- a step of a running workload, or a job that jobs not ended still wait on
-- (P:awaited:{id}), keeps its record (dependants read its state and result), its request
-- records and its idempotency key until the workload is done and no job waits on it; the
-- sweep expires them after that. The key gets the record's TTL only while it names this job
-- (a repeated key returns the existing job exactly as long as its summary is kept)
local wid = R['workload_id']
if not ((wid and redis.call('SISMEMBER', key_workloads_active(ARGV[4]), wid) == 1)
        or awaited_live(ARGV[4], ARGV[1])) then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', key_requests(ARGV[4], ARGV[1]), ARGV[3])
  if idem and redis.call('GET', key_idem(ARGV[4], idem)) == ARGV[1] then
    redis.call('EXPIRE', key_idem(ARGV[4], idem), ARGV[3])
  end
end
redis.call('ZREM', key_finished(ARGV[4]), ARGV[1])  -- off the finished index in the same step
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], state, 1)
return 1
