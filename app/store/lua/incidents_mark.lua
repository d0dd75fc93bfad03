-- incidents_mark.lua: the health observer's once-per-operation rule for overrun incidents,
-- with bounded memory: first drop from P:incidents:seen every op id whose agenda entry has
-- closed (no longer on P:agenda:index; an op id is not reopened) and return it with the ids
-- of the incidents raised for it (the caller writes their recovery records), then add the op
-- ids that overrun now and return those not in the hash before (to report). A set left by an
-- older observer (the op ids alone) is read as a hash with no incident ids.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:incidents:seen   hash: agenda op id reported as overrunning -> its incident ids
--                             (comma-separated; '' until the caller wrote them)
-- KEYS[2]  P:agenda:index     open agenda op ids
-- ARGV[1..n]  op ids of the open POSITIVE entries that overrun now
-- Returns {fresh, closed}: fresh = the op ids of ARGV that were not in P:incidents:seen;
-- closed = {op id, incident ids, ...} of the entries that closed since.
local seen = {}
if redis.call('TYPE', KEYS[1]).ok == 'set' then
  for _, op in ipairs(redis.call('SMEMBERS', KEYS[1])) do table.insert(seen, op); table.insert(seen, '') end
  redis.call('DEL', KEYS[1])
  if #seen > 0 then redis.call('HSET', KEYS[1], unpack(seen)) end
else
  seen = redis.call('HGETALL', KEYS[1])
end
local closed = {}
for i = 1, #seen, 2 do
  if not redis.call('ZSCORE', KEYS[2], seen[i]) then
    redis.call('HDEL', KEYS[1], seen[i])
    table.insert(closed, seen[i]); table.insert(closed, seen[i + 1])
  end
end
local fresh = {}
for i = 1, #ARGV do
  if redis.call('HSETNX', KEYS[1], ARGV[i], '') == 1 then table.insert(fresh, ARGV[i]) end
end
return {fresh, closed}
