-- hosts_down.lua: the health observer's host_down incidents (makespan.workers.observer), one
-- atomic step per cycle whatever other observers do. Per host of ARGV, from the liveness a
-- GPU worker keeps (P:hosts:seen, P:host:live:{host}) and the host's entry in
-- P:incidents:hosts_down ('since:<s>': down, not reported yet; 'open:<incident id>:<s>': its
-- incident, of an outage seen since s): a host seen once with no live key gets 'since:' now, and its
-- incident once it has been down ARGV[1] s (the grace: a rolling restart, or the second
-- worker of a host renewing the shared key, is no incident); a host whose live key is back
-- (or that left the published fleet: flag '0'; or that an operator cordoned: flag 'c') loses
-- its entry, and an open incident gets its recovery record. Server clock (TIME).
-- Library: none
-- Transitions: none
--
-- KEYS[1]  P:incidents:hosts_down   host -> 'since:<s>' | 'open:<incident id>:<since s>'
-- KEYS[2]  P:incidents              the incidents stream
-- KEYS[3]  P:hosts:seen             hosts a GPU worker announced once
-- KEYS[4..] P:host:live:{host}      one per host of ARGV, in their order
-- ARGV[1]  grace s (>= 0)
-- ARGV[2]  the stream's approximate cap (XADD MAXLEN ~)
-- ARGV[3..] per host, three values: its name; '1' (a host of the caller's fleet), '0' (a
--          host the published fleet no longer has: only closed) or 'c' (a cordoned host of the
--          caller's fleet: out of service on purpose, only closed); its incident's fields as a
--          JSON object of strings (detected_at is added here; '{}' when the caller saw it up)
-- Returns {raised, recovered}: raised = {host, incident id, detected_at, ...}; recovered =
-- {host, incident id, recovery_s, ...}: recovery_s is the outage, from when an observer first
-- saw the host without a live worker (the incident was raised a grace later).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local grace = tonumber(ARGV[1])
local raised, recovered = {}, {}
local n = (#ARGV - 2) / 3
for i = 1, n do
  local host, member, fields = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  local state = redis.call('HGET', KEYS[1], host)
  local down = member == '1' and redis.call('EXISTS', KEYS[3 + i]) == 0
               and redis.call('HEXISTS', KEYS[3], host) == 1
  if down then
    local since = nil
    if not state then
      since = now
      redis.call('HSET', KEYS[1], host, 'since:' .. string.format('%.6f', now))
    elseif string.sub(state, 1, 6) == 'since:' then
      since = tonumber(string.sub(state, 7))
    end
    if since and now - since >= grace and fields ~= '{}' then
      local record = cjson.decode(fields)
      record['kind'] = 'incident'
      record['detected_at'] = string.format('%.6f', now)
      local flat = {}
      for k, v in pairs(record) do table.insert(flat, k); table.insert(flat, tostring(v)) end
      local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(flat))
      -- the outage's start, not the incident's: its recovery_s is how long the host was down
      redis.call('HSET', KEYS[1], host, 'open:' .. id .. ':' .. string.format('%.6f', since))
      table.insert(raised, host); table.insert(raised, id); table.insert(raised, record['detected_at'])
    end
  elseif state then
    if string.sub(state, 1, 5) == 'open:' then
      local id, since = string.match(string.sub(state, 6), '^(.*):([^:]*)$')
      local outcome = 'recovered: a GPU worker consumes its queue again'
      if member == '0' then
        outcome = 'recovered: the host left the published fleet'
      elseif member == 'c' then
        outcome = 'closed: the host was cordoned (out of service on purpose)'
      end
      local took = string.format('%.3f', math.max(0, now - tonumber(since)))
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', 'recovery', 'incident_id', id,
                 'endpoint', '', 'host', host, 'outcome', outcome,
                 'recovered_at', string.format('%.6f', now), 'recovery_s', took)
      table.insert(recovered, host); table.insert(recovered, id); table.insert(recovered, took)
    end
    redis.call('HDEL', KEYS[1], host)
  end
end
return {raised, recovered}
