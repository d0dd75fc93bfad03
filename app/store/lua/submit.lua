-- submit.lua: write one validated job: its record, idempotency key, queue entry (or
-- P:delayed entry) and submitted event, atomically.
-- Library: lib
-- Transitions: new -> queued, new -> delayed
--
-- KEYS[1]  P:idem:{key} (any key when ARGV[1] is not '1')
-- KEYS[2]  P:seq
-- KEYS[3]  P:job:{id}
-- KEYS[4]  P:queue:{level}
-- KEYS[5]  P:events
-- KEYS[6]  P:planner:wake
-- KEYS[7]  P:delayed
-- KEYS[8]  P:planner:critical (the critical lane's arrivals)
-- KEYS[9]  P:stats:submits (priority name -> jobs accepted; a repeated key is not counted)
-- ARGV[1]  '1' when the job has an idempotency key
-- ARGV[2]  job id
-- ARGV[3]  the record's fields, JSON object (state queued)
-- ARGV[4]  the submitted event, JSON
-- ARGV[5]  delay s ('' = queue now); due time (not_before) = server clock + delay
-- ARGV[6]  P, the key prefix (a job with deps joins the reverse-dependency index)
-- ARGV[7]  '1' when the job is CRITICAL: a queued one is also pushed on KEYS[8] (last 256 kept)
-- ARGV[8]  '1': the caller waits for replicas (WAIT) after this script: a repeated key is
--          written again (SET ... KEEPTTL, same value), so the WAIT covers it, and with it
--          every earlier write (the original submit included: replication is in order)
-- Returns {1, job id}, or {0, existing job id} for a repeated idempotency key, or
-- {-1, dependency id} when a job the record's deps name has no record (an unknown id, or
-- one whose summary retention deleted): nothing is written (a dependant of a missing job
-- would only be cancelled by the planner's next tick).
if ARGV[1] == '1' then
  local existing = redis.call('GET', KEYS[1])
  if existing then
    if ARGV[8] == '1' then redis.call('SET', KEYS[1], existing, 'KEEPTTL') end
    return {0, existing}
  end
end
local fields = cjson.decode(ARGV[3])
if fields['deps'] and fields['deps'] ~= '' then
  for _, d in ipairs(cjson.decode(fields['deps'])) do
    if redis.call('EXISTS', key_job(ARGV[6], d)) == 0 then return {-1, d} end
  end
end
local seq = redis.call('INCR', KEYS[2])
local flat = {}
for k, v in pairs(fields) do table.insert(flat, k); table.insert(flat, tostring(v)) end
table.insert(flat, 'seq'); table.insert(flat, tostring(seq))
local ev = ARGV[4]
local due = nil
if ARGV[5] ~= '' then
  local t = redis.call('TIME')
  due = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[5]))
  table.insert(flat, 'state'); table.insert(flat, 'delayed')
  table.insert(flat, 'not_before'); table.insert(flat, due)
  local e = cjson.decode(ev); e['not_before'] = tonumber(due); ev = cjson.encode(e)
end
redis.call('HSET', KEYS[3], unpack(flat))
redis.call('HINCRBY', KEYS[9], fields['priority'], 1)
awaited_add(ARGV[6], ARGV[2], fields['deps'])
if due then
  redis.call('ZADD', KEYS[7], due, ARGV[2])
else
  redis.call('ZADD', KEYS[4], seq, ARGV[2])
end
if ARGV[1] == '1' then redis.call('SET', KEYS[1], ARGV[2]) end
append_event(KEYS[5], ev)
redis.call('RPUSH', KEYS[6], '1')
redis.call('LTRIM', KEYS[6], 0, 15)  -- the first 16: a release LPUSHed at the head stays
if ARGV[7] == '1' and not due then
  redis.call('RPUSH', KEYS[8], ARGV[2])
  redis.call('LTRIM', KEYS[8], -256, -1)
end
return {1, ARGV[2]}
