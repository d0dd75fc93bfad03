-- fenced.lua: a list of writes applied only while the lease is current (every GPU still
-- names lease id and token), all or none.
-- Library: lib
-- Transitions: leased -> running, leased -> delayed, running -> delayed, leased -> completed,
--   leased -> failed, leased -> cancelled, running -> completed, running -> failed,
--   running -> cancelled
--
-- KEYS[1..n]   P:gpu:{uuid} of each GPU of the lease
-- KEYS[n+1..]  the keys the ops touch
-- ARGV[1]  lease id
-- ARGV[2]  fencing token
-- ARGV[3]  n, the lease's GPU count
-- ARGV[4]  ops, JSON: [[cmd, key index (1-based into KEYS), args...], ...]; cmd is a Redis
--          write command, or one of
--            XADD_E     args: event JSON                       (append_event)
--            DELIFEQ    args: value                            (DEL while the key holds value)
--            HSETX      args: field, value, ...                (HSET while the hash exists)
--            START_JOB  key P:job:{id}; args: started_at_s      (state running)
--            DELAY_JOB  key P:job:{id}; args: job id, due_s, reason, last_error (state delayed)
--            FINISH_JOB key P:job:{id}; args: job id, state, finished_at_s, reason (finish_job)
-- ARGV[5]  P, the key prefix (FINISH_JOB, DELAY_JOB)
-- Returns 1 (applied) or 0 (stale: nothing applied).
local want = ARGV[1] .. ':' .. ARGV[2]
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= want then return 0 end
end
local ops = cjson.decode(ARGV[4])
for _, op in ipairs(ops) do
  local cmd = op[1]; local key = KEYS[op[2]]
  local args = {}
  for j = 3, #op do table.insert(args, op[j]) end
  if cmd == 'XADD_E' then
    append_event(key, args[1])
  elseif cmd == 'DELIFEQ' then
    if redis.call('GET', key) == args[1] then redis.call('DEL', key) end
  elseif cmd == 'HSETX' then
    if redis.call('EXISTS', key) == 1 then redis.call('HSET', key, unpack(args)) end
  elseif cmd == 'START_JOB' then
    redis.call('HSET', key, 'state', 'running', 'started_at', args[1])
  elseif cmd == 'DELAY_JOB' then
    forget_lease(key)
    redis.call('HSET', key, 'state', 'delayed', 'not_before', args[2], 'reason', args[3], 'last_error', args[4])
    redis.call('ZADD', key_delayed(ARGV[5]), args[2], args[1])
  elseif cmd == 'FINISH_JOB' then
    finish_job(ARGV[5], args[1], args[2], args[3], args[4])
  else
    redis.call(cmd, key, unpack(args))
  end
end
return 1
