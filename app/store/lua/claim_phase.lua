-- claim_phase.lua: claim one phase of a lease for the task copy that runs it (a second
-- delivery of the same phase task finds it claimed), only while the lease is current: its
-- record exists and every GPU still names lease id and token. A claim after a reclaim or a
-- preemption dropped the lease would recreate its phase hash (with no TTL, never deleted
-- again) and run a phase of a lease that is no longer held.
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:lease:{id}
-- KEYS[2]  P:phase:{lease id}
-- KEYS[3..] P:gpu:{uuid} of each GPU of the lease
-- ARGV[1]  lease id
-- ARGV[2]  fencing token
-- ARGV[3]  phase name (the field written is '{phase}:claimed')
-- Returns 1 (claimed now), 0 (claimed before: a duplicate delivery) or -1 (the lease is no
-- longer current: nothing written).
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local want = ARGV[1] .. ':' .. ARGV[2]
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) ~= want then return -1 end
end
return redis.call('HSETNX', KEYS[2], ARGV[3] .. ':claimed', '1')
