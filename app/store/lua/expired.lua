-- expired.lua: the ids of the leases whose expiry has passed on the server clock
-- (candidates: reclaim.lua checks each again).
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:leases
-- Returns a list of lease ids.
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', server_now_ms())
