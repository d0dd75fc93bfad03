-- incidents_mark.lua: the health observer's once-per-operation rule for overrun incidents,
-- with bounded memory: first drop from P:incidents:seen every op id whose agenda entry has
-- closed (no longer on P:agenda:index; an op id is not reopened), then add the op ids that
-- overrun now and return those not in the set before (to report).
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:incidents:seen   agenda op ids already reported as overrunning
-- KEYS[2]  P:agenda:index     open agenda op ids
-- ARGV[1..n]  op ids of the open POSITIVE entries that overrun now
-- Returns the op ids of ARGV that were not in P:incidents:seen.
for _, op in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if not redis.call('ZSCORE', KEYS[2], op) then redis.call('SREM', KEYS[1], op) end
end
local fresh = {}
for i = 1, #ARGV do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then table.insert(fresh, ARGV[i]) end
end
return fresh
