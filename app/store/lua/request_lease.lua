-- request_lease.lua: take one request lease on an endpoint instance under its concurrency
-- cap (makespan.workers.requests); expired leases are dropped first. A request that finds
-- the cap reached is counted as a waiter until its deadline (each try moves the deadline on);
-- one that takes a lease stops being counted. A waiter that dies, or whose removal is lost
-- to a Redis outage, stops counting at its deadline: no lost write leaves a count behind.
-- Library: lib
-- Transitions: none
--
-- KEYS[1]  P:reqlease:{instance}    request leases, score = expiry (unix ms, server clock)
-- KEYS[2]  P:reqpeak:{instance}     most request leases ever held at once
-- KEYS[3]  P:reqwaiters:{instance}  requests waiting for a lease, score = deadline (unix ms, server clock)
-- ARGV[1]  member (the request's id)
-- ARGV[2]  ttl_ms: the lease expires at server clock + ttl_ms
-- ARGV[3]  cap (the endpoint's slots)
-- ARGV[4]  waiter_ttl_ms: a request at the cap counts as a waiter until server clock + this
-- Returns the leases now held (>= 1), or 0 when the cap is reached.
local server_now_ms = server_now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', server_now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', server_now_ms)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then
  local waiter_ttl_ms = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], server_now_ms + waiter_ttl_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[3], waiter_ttl_ms)  -- the whole set goes once nobody waits
  return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[1], server_now_ms + tonumber(ARGV[2]), ARGV[1])
n = n + 1
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > peak then redis.call('SET', KEYS[2], n) end
return n
