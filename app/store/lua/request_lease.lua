-- request_lease.lua: take one request lease on an endpoint instance under its concurrency
-- cap (makespan.workers.requests); expired leases are dropped first.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:reqlease:{instance}   request leases, score = expiry (unix ms, server clock)
-- KEYS[2]  P:reqpeak:{instance}    most request leases ever held at once
-- ARGV[1]  member (the request's id)
-- ARGV[2]  ttl_ms: the lease expires at server clock + ttl_ms
-- ARGV[3]  cap (the endpoint's slots)
-- Returns the leases now held (>= 1), or 0 when the cap is reached.
local server_now_ms = server_now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', server_now_ms)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], server_now_ms + tonumber(ARGV[2]), ARGV[1])
n = n + 1
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > peak then redis.call('SET', KEYS[2], n) end
return n
