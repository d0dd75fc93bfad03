-- index_if_exists.lua: add a registered endpoint instance to the per-GPU index sets of its
-- GPUs only while its hash exists: an instance unregistered meanwhile (its hash and its
-- index entries go in one transaction) leaves no id behind
-- (makespan.workers.drivers.registry.index_instances).
-- Library: none
-- Transitions: none
--
-- KEYS[1]      P:instance:{id}
-- KEYS[2..]    P:gpu_instances:{uuid} of each of its GPUs
-- ARGV[1]      the instance id
-- Returns 1 (indexed) or 0 (no such instance).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 2, #KEYS do redis.call('SADD', KEYS[i], ARGV[1]) end
return 1
