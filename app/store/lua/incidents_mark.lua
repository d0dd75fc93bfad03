-- incidents_mark.lua: the health observer's once-per-operation rule for overrun incidents,
-- with bounded memory: first drop from P:incidents:overruns every op id whose agenda entry
-- has closed (no longer on P:agenda:index; an op id is not reopened) and return it with what
-- the hash held for it (the ids of the incidents raised for it, 'reaped:' first when the
-- agenda reaped the entry: the caller writes their recovery records), then add the op ids
-- that overrun now and return those not in the hash before (to report).
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:incidents:overruns  hash: agenda op id reported as overrunning -> its incident ids
--                                (comma-separated; '' until the caller wrote them; agenda_reap.lua
--                                puts 'reaped:' before them)
-- KEYS[2]  P:agenda:index        open agenda op ids
-- ARGV[1..n]  op ids of the open POSITIVE entries that overrun now
-- Returns {fresh, closed}: fresh = the op ids of ARGV that were not in P:incidents:overruns;
-- closed = {op id, its value, ...} of the entries that closed since.
local seen = redis.call('HGETALL', KEYS[1])
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
