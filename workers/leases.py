"""GPU leases: gang acquire, heartbeat renew, fencing check, release and reclaim.

Each operation is one Lua script, so a gang is leased whole or not at all and a job
is acknowledged (removed from its queue) in the same step that publishes its lease.

Per GPU, ``P:gpu:{uuid}`` holds ``{lease_id}:{token}`` with a PX expiry; the token is
a fencing token from the monotonic counter ``P:fence`` (Kleppmann, "How to do
distributed locking", 2016). A holder acts only while every GPU of its gang still
names its lease and token; a reclaimed or expired lease makes its later writes no-ops.

One clock decides lease time: the Redis server's. Each script reads ``TIME`` itself
(:data:`SERVER_NOW_MS`; allowed in Redis >= 5 scripts, which replicate effects) to
compute ``expires_ms`` (unix ms, the score in ``P:leases``) on acquire and renew and to
compare it on :meth:`LeaseStore.expired` and reclaim, exactly as the GPU keys' PX
expiry runs on that clock. Planner and GPU workers on hosts whose clocks disagree then
agree on when a lease expires: a planner whose clock runs ahead does not reclaim a live
lease (the job would run twice), one that runs behind does not leak GPUs for the skew.
Event timestamps (``ts``, ``leased_at``, ``finished_at``) stay on the caller's clock,
like every other event; they feed reports, not expiry decisions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from app.awaited import DROP_LUA
from app.errors import LeaseError, StaleFencingToken
from app.keys import Keys

log = logging.getLogger(__name__)

# Lua prelude: ``server_now_ms``, the Redis server's clock in unix ms (one TIME call).
SERVER_NOW_MS = """
local server_t = redis.call('TIME')
local server_now_ms = tonumber(server_t[1]) * 1000 + math.floor(tonumber(server_t[2]) / 1000)
"""

# KEYS: fence, lease, leases, job, queue, running, planner_fence, events, gpu_1..gpu_n[, resident_1..resident_n]
# ARGV: lease_id, job_id, ttl_ms, now_ms (caller's clock: leased_at, running score only), holder,
#       lease JSON fields, planner_token, event JSON, job_state,
#       instance value ('' = no resident keys; else the reply says whether every GPU holds that instance),
#       key prefix (a leased job leaves the reverse-dependency index, app.awaited: it waits on nothing now)
# expires_ms = server clock + ttl_ms
_ACQUIRE = SERVER_NOW_MS + DROP_LUA + """
local n = #KEYS - 8
if ARGV[10] ~= '' then n = n / 2 end
if ARGV[7] ~= '' and redis.call('GET', KEYS[7]) ~= ARGV[7] then return {0, 'planner_fenced'} end
if ARGV[9] == 'queued' and not redis.call('ZSCORE', KEYS[5], ARGV[2]) then return {0, 'not_queued'} end
for i = 1, n do
  if redis.call('EXISTS', KEYS[8 + i]) == 1 then return {0, 'busy', KEYS[8 + i]} end
end
local token = redis.call('INCR', KEYS[1])
local val = ARGV[1] .. ':' .. token
for i = 1, n do redis.call('SET', KEYS[8 + i], val, 'PX', ARGV[3]) end
local fields = cjson.decode(ARGV[6])
local expires_ms = server_now_ms + tonumber(ARGV[3])
local flat = {'token', tostring(token), 'expires_ms', tostring(expires_ms)}
for k, v in pairs(fields) do table.insert(flat, k); table.insert(flat, tostring(v)) end
redis.call('HSET', KEYS[2], unpack(flat))
redis.call('ZADD', KEYS[3], expires_ms, ARGV[1])
if ARGV[9] == 'queued' then
  redis.call('ZREM', KEYS[5], ARGV[2])
  awaited_drop(ARGV[11], ARGV[2], redis.call('HGET', KEYS[4], 'deps'))
  redis.call('HSET', KEYS[4], 'state', 'leased', 'lease', ARGV[1], 'token', tostring(token),
             'leased_at', tostring(tonumber(ARGV[4]) / 1000.0))
  redis.call('ZADD', KEYS[6], ARGV[4], ARGV[2])
end
local ev = cjson.decode(ARGV[8]); ev['token'] = token
redis.call('XADD', KEYS[8], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
local warm = 0
if ARGV[10] ~= '' then
  warm = 1
  for i = 1, n do
    if redis.call('GET', KEYS[8 + n + i]) ~= ARGV[10] then warm = 0 end
  end
end
return {1, token, warm}
"""

# KEYS: lease, leases, gpu_1..gpu_n ; ARGV: lease_id, token, ttl_ms (0 = check only)
# expires_ms = server clock + ttl_ms
_RENEW = SERVER_NOW_MS + """
local want = ARGV[1] .. ':' .. ARGV[2]
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) ~= want then return 0 end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  for i = 3, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
  redis.call('ZADD', KEYS[2], server_now_ms + ttl, ARGV[1])
  redis.call('HSET', KEYS[1], 'expires_ms', tostring(server_now_ms + ttl))
end
return 1
"""

# Fenced write: verify the token on every GPU, then apply ops.
# KEYS: gpu_1..gpu_n, then the keys ops touch ; ARGV: lease_id, token, n_gpus, ops JSON
# ops: [[cmd, key_index(1-based into KEYS), args...], ...]  cmd in HSET, SET, DEL, ZREM, ZADD, XADD_E
_FENCED = """
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
    redis.call('XADD', key, 'MAXLEN', '~', '1000000', '*', 'e', args[1])
  elseif cmd == 'DELIFEQ' then
    if redis.call('GET', key) == args[1] then redis.call('DEL', key) end
  else
    redis.call(cmd, key, unpack(args))
  end
end
return 1
"""

# Reclaim one expired lease (its holder stopped renewing).
# A requeued job waits as a delayed job (workers.delayed) when a retry backoff is set.
# KEYS: lease, leases, running, events ; ARGV: lease_id, now_ms (caller's clock: event ts and
# finished_at only), max_attempts, prefix, retry backoff s (0 = queue at once), longest backoff s
# Expired means expires_ms <= the server clock; a backoff's due time is on the server clock too.
_RECLAIM = SERVER_NOW_MS + """
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > server_now_ms then return {0, 'live'} end
local lease = redis.call('HGETALL', KEYS[1])
local L = {}
for i = 1, #lease, 2 do L[lease[i]] = lease[i + 1] end
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
for _, g in ipairs(gpus) do
  local gk = ARGV[4] .. ':gpu:' .. g
  local cur = redis.call('GET', gk)
  if cur == want then redis.call('DEL', gk) end
  -- what is resident is unknown after a holder died mid-transition, unless the GPU key
  -- expired and a newer lease already holds the GPU: then the marker is the new holder's
  if cur == want or not cur then redis.call('DEL', ARGV[4] .. ':resident:' .. g) end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[4] .. ':busy:' .. ARGV[1])
local executed = redis.call('HGET', ARGV[4] .. ':phase:' .. ARGV[1], 'execute') == 'done'
redis.call('DEL', ARGV[4] .. ':phase:' .. ARGV[1])
local job = L['job']
local outcome = 'released'
if job and L['kind'] == 'job' then
  local jk = ARGV[4] .. ':job:' .. job
  redis.call('ZREM', KEYS[3], job)
  local state = redis.call('HGET', jk, 'state')
  if state == 'leased' or state == 'running' then
    local attempts = redis.call('HINCRBY', jk, 'attempts', 1)
    if executed then  -- its workload already ran to the end: never run it twice
      redis.call('HSET', jk, 'state', 'completed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0),
                 'reason', 'completed; lease reclaimed after execute')
      outcome = 'completed'
    elseif redis.call('HGET', jk, 'cancel_requested') == '1' then
      redis.call('HSET', jk, 'state', 'cancelled', 'reason', 'cancelled; lease reclaimed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0))
      outcome = 'cancelled'
    elseif attempts >= tonumber(ARGV[3]) then
      redis.call('HSET', jk, 'state', 'failed', 'finished_at', tostring(tonumber(ARGV[2]) / 1000.0),
                 'reason', 'lease expired: its GPU worker stopped renewing it (' .. attempts .. ' attempts)')
      outcome = 'failed'
    else
      local prio = redis.call('HGET', jk, 'priority')
      local seq = redis.call('HGET', jk, 'seq')
      local backoff = tonumber(ARGV[5] or '0') or 0
      redis.call('HDEL', jk, 'lease', 'token')
      if backoff > 0 then
        local wait = math.min(backoff * 2 ^ (attempts - 1), tonumber(ARGV[6]))
        local due = server_now_ms / 1000.0 + wait
        redis.call('HSET', jk, 'state', 'delayed', 'not_before', tostring(due),
                   'reason', 'requeued: lease expired (holder lost); retry after ' .. wait .. ' s')
        redis.call('ZADD', ARGV[4] .. ':delayed', due, job)
      else
        redis.call('HSET', jk, 'state', 'queued', 'reason', 'requeued: lease expired (holder lost)')
        redis.call('ZADD', ARGV[4] .. ':queue:' .. string.lower(prio), tonumber(seq), job)
      end
      outcome = 'requeued'
    end
    if outcome ~= 'requeued' then  -- a final state: on the finished index (workers.retention)
      redis.call('ZADD', ARGV[4] .. ':finished', tonumber(ARGV[2]) / 1000.0, job)
    end
  end
end
local ev = {ts = tonumber(ARGV[2]) / 1000.0, kind = 'reclaimed', lease = ARGV[1], job = job, outcome = outcome, gpus = gpus,
            expired_at = tonumber(L['expires_ms'] or ARGV[2]) / 1000.0}
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
if outcome == 'requeued' or outcome == 'failed' or outcome == 'completed' then
  local ev2 = {ts = tonumber(ARGV[2]) / 1000.0, kind = outcome, job = job, lease = ARGV[1], reason = 'lease expired'}
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev2))
end
return {1, outcome}
"""


# Lease ids whose expiry has passed on the server clock (candidates: reclaim checks again).
# KEYS: leases ; ARGV: none
_EXPIRED = SERVER_NOW_MS + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', server_now_ms)
"""


def now_ms() -> int:
    """The caller's clock in unix ms: event timestamps only, never a lease expiry."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Lease:
    """A published lease. ``token`` is its fencing token."""

    lease_id: str
    token: int
    gpus: tuple[str, ...]
    warm: bool = False  # every GPU held the instance asked for (``acquire(instance=...)``) when leased


class LeaseStore:
    """Lease operations on one Redis and key prefix. Every method is one atomic script."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self._acquire = r.register_script(_ACQUIRE)
        self._renew = r.register_script(_RENEW)
        self._fenced = r.register_script(_FENCED)
        self._reclaim = r.register_script(_RECLAIM)
        self._expired = r.register_script(_EXPIRED)

    def acquire(self, lease_id: str, gpus: tuple[str, ...], ttl_s: float, *, job_id: str = "", kind: str = "job",
                holder: str = "", queue: str = "", planner_token: str = "", info: dict[str, Any] | None = None,
                event: dict[str, Any] | None = None, instance: str = "") -> Lease | None:
        """Lease ``gpus`` whole or not at all. For ``kind == "job"`` the job must still be
        queued in ``queue``; it is removed from it (acknowledged) in the same step.
        ``planner_token`` (when given) must equal the planner fencing counter: a deposed
        planner cannot publish. With ``instance`` (a ``P:resident`` value) the returned
        lease's ``warm`` says whether every GPU held that instance when it was leased
        (no other holder can change that while the lease is current). Returns None when
        a GPU is busy or the job is gone.

        Raises:
            LeaseError: the planner was fenced off (another planner leads now).
        """
        keys, args = self._acquire_call(lease_id, gpus, ttl_s, job_id, kind, holder, queue, planner_token, info,
                                        event, instance)
        return self._acquired(self._acquire(keys=keys, args=args), lease_id, gpus)

    def acquire_many(self, requests: list[dict[str, Any]]) -> tuple[list[Lease | None], bool]:
        """Several :meth:`acquire` calls (each a dict of its keyword arguments, with
        ``lease_id``, ``gpus`` and ``ttl_s``) in one round trip, applied in order; each
        is its own atomic script, exactly as if called one by one. Returns the leases
        (None where a GPU was busy or the job gone, and for every call from the first
        one refused by the planner fence on) and whether the planner fence refused one
        (the caller then raises :class:`LeaseError` after handling the leases before it).
        """
        calls = [self._acquire_call(q["lease_id"], q["gpus"], q["ttl_s"], q.get("job_id", ""), q.get("kind", "job"),
                                    q.get("holder", ""), q.get("queue", ""), q.get("planner_token", ""),
                                    q.get("info"), q.get("event"), q.get("instance", "")) for q in requests]
        p = self.r.pipeline(transaction=False)
        for keys, args in calls:
            p.evalsha(self._acquire.sha, len(keys), *keys, *args)
        outs = p.execute(raise_on_error=False)
        leases: list[Lease | None] = []
        for q, (keys, args), out in zip(requests, calls, outs):
            if isinstance(out, redis.exceptions.NoScriptError):  # not loaded yet (or Redis restarted)
                out = self._acquire(keys=keys, args=args)
            elif isinstance(out, Exception):
                # Redis refused this one script (e.g. OOM: refused before it ran, so the
                # job stays queued for the next tick); the leases around it still count
                log.warning("lease %s for job %s not taken: %s", q["lease_id"], q.get("job_id"), out)
                leases.append(None)
                continue
            try:
                leases.append(self._acquired(out, q["lease_id"], q["gpus"]))
            except LeaseError:
                return leases + [None] * (len(requests) - len(leases)), True
        return leases, False

    def _acquire_call(self, lease_id, gpus, ttl_s, job_id, kind, holder, queue, planner_token, info, event,
                      instance) -> tuple[list[str], list[Any]]:
        fields = {"job": job_id, "kind": kind, "holder": holder, "gpus": json.dumps(list(gpus)),
                  **(info or {})}
        ev = {"ts": time.time(), "kind": "leased", "lease": lease_id, "job": job_id or None, "gpus": list(gpus),
              **(event or {})}
        keys = [self.keys.fence, self.keys.lease(lease_id), self.keys.leases, self.keys.job(job_id or "-"),
                queue or self.keys.queue("normal"), self.keys.running, self.keys.planner_fence, self.keys.events,
                *[self.keys.gpu(g) for g in gpus], *([self.keys.resident(g) for g in gpus] if instance else [])]
        return keys, [lease_id, job_id, int(ttl_s * 1000), now_ms(), holder, json.dumps(fields), planner_token,
                      json.dumps(ev), "queued" if kind == "job" else "none", instance, self.keys.prefix]

    @staticmethod
    def _acquired(out: list, lease_id: str, gpus: tuple[str, ...]) -> Lease | None:
        if out[0] == 1:
            return Lease(lease_id, int(out[1]), tuple(gpus), bool(out[2]))
        if out[1] == "planner_fenced":
            raise LeaseError("planner fencing token is stale: another planner leads")
        return None

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend ``lease`` to ``ttl_s`` seconds from now on the Redis server's clock if it
        is still ours; False if stale."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        return bool(self._renew(keys=keys, args=[lease.lease_id, lease.token, int(ttl_s * 1000)]))

    def check(self, lease: Lease) -> None:
        """Raise :class:`StaleFencingToken` unless every GPU still names this lease."""
        keys = [self.keys.lease(lease.lease_id), self.keys.leases, *[self.keys.gpu(g) for g in lease.gpus]]
        if not self._renew(keys=keys, args=[lease.lease_id, lease.token, 0]):
            raise StaleFencingToken(f"lease {lease.lease_id} token {lease.token} is no longer current")

    def fenced(self, lease: Lease, ops: list[tuple]) -> bool:
        """Apply ``ops`` atomically iff the lease is still current. Each op is
        ``(cmd, key, *args)``: any Redis write command (HSET, SET, DEL, ZADD, RPUSH, ...),
        ``("XADD_E", stream_key, event_json)`` (an event), or ``("DELIFEQ", key, value)``
        (delete only while the key still holds ``value``). Returns False (nothing
        applied) if stale."""
        keys = [self.keys.gpu(g) for g in lease.gpus]
        enc = []
        for op in ops:
            cmd, key, *args = op
            if key not in keys:
                keys.append(key)
            enc.append([cmd, keys.index(key) + 1, *[str(a) for a in args]])
        return bool(self._fenced(keys=keys, args=[lease.lease_id, lease.token, len(lease.gpus), json.dumps(enc)]))

    def expired(self, pipe: redis.client.Pipeline | None = None) -> list[str] | None:
        """Ids of the leases whose expiry has passed on the Redis server's clock (read
        inside one script: the caller's clock plays no part). With ``pipe`` the read is
        queued on that pipeline and None returned; its result comes from ``pipe.execute()``
        (sent as EVAL: no extra SCRIPT EXISTS round trip, no NOSCRIPT after a restart)."""
        if pipe is not None:
            pipe.eval(_EXPIRED, 1, self.keys.leases)
            return None
        return list(self._expired(keys=[self.keys.leases]))

    def reclaim(self, lease_id: str, max_attempts: int, retry_backoff_s: float = 0.0,
                retry_backoff_max_s: float = 300.0) -> str:
        """Reclaim one expired lease: free its GPUs, requeue its job (with its original
        submission order) or fail it after ``max_attempts``. With ``retry_backoff_s`` > 0
        the job is requeued as a delayed job due in min(retry_backoff_s × 2^(attempts−1),
        retry_backoff_max_s) seconds (workers.delayed). Returns the outcome."""
        out = self._reclaim(keys=[self.keys.lease(lease_id), self.keys.leases, self.keys.running, self.keys.events],
                            args=[lease_id, now_ms(), max_attempts, self.keys.prefix, repr(float(retry_backoff_s)),
                                  repr(float(retry_backoff_max_s))])
        return out[1]

    def reclaim_expired(self, max_attempts: int, retry_backoff_s: float = 0.0, retry_backoff_max_s: float = 300.0,
                        expired: list[str] | None = None) -> dict[str, int]:
        """Reclaim every expired lease (``expired``: their ids, already read; each is
        checked again inside its reclaim script). Returns counts by outcome."""
        counts: dict[str, int] = {}
        for lid in self.expired() if expired is None else expired:
            o = self.reclaim(lid, max_attempts, retry_backoff_s, retry_backoff_max_s)
            counts[o] = counts.get(o, 0) + 1
        return counts

    def active(self) -> list[dict[str, Any]]:
        out = []
        for lid in self.r.zrange(self.keys.leases, 0, -1):
            rec = self.r.hgetall(self.keys.lease(lid))
            if rec:
                rec["lease_id"] = lid
                rec["gpus"] = json.loads(rec.get("gpus", "[]"))
                out.append(rec)
        return out

    def gpu_holders(self, gpus: list[str]) -> dict[str, str | None]:
        vals = self.r.mget([self.keys.gpu(g) for g in gpus]) if gpus else []
        return dict(zip(gpus, vals))


# Preempt one job lease: free its GPUs and put its job back in its queue with its
# original submission order (design notes, "Preemption"). Not counted as an attempt.
# Refused for a job whose execute phase is done (it only has to clear: never run it
# twice) and for a deposed planner. A job whose cancel was requested is cancelled.
# KEYS: lease, leases, running, events, planner_fence, finished
# ARGV: lease_id, now_ms, prefix, preemptor job id, planner token ('' = unchecked)
_PREEMPT = """
if ARGV[5] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[5] then return {0, 'planner_fenced'} end
local lease = redis.call('HGETALL', KEYS[1])
if #lease == 0 then return {0, 'gone'} end
local L = {}
for i = 1, #lease, 2 do L[lease[i]] = lease[i + 1] end
if L['kind'] ~= 'job' then return {0, 'not_a_job'} end
local phases = ARGV[3] .. ':phase:' .. ARGV[1]
if redis.call('HGET', phases, 'execute') == 'done' then return {0, 'executed'} end
local started = redis.call('HGET', phases, 'start_endpoint') == 'done'
local want = ARGV[1] .. ':' .. (L['token'] or '')
local gpus = cjson.decode(L['gpus'] or '[]')
for _, g in ipairs(gpus) do
  local gk = ARGV[3] .. ':gpu:' .. g
  if redis.call('GET', gk) == want then
    redis.call('DEL', gk)
    -- mid-transition, what is resident is unknown: forget it (the next start stops leftovers)
    if not started then redis.call('DEL', ARGV[3] .. ':resident:' .. g) end
  end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[3] .. ':busy:' .. ARGV[1])
redis.call('DEL', phases)
local job = L['job']
local jk = ARGV[3] .. ':job:' .. job
local now_s = tonumber(ARGV[2]) / 1000.0
redis.call('ZREM', KEYS[3], job)
local prio = redis.call('HGET', jk, 'priority')
local outcome = 'preempted'
if redis.call('HGET', jk, 'cancel_requested') == '1' then
  redis.call('HSET', jk, 'state', 'cancelled', 'reason', 'cancelled; preempted', 'finished_at', tostring(now_s))
  redis.call('ZADD', KEYS[6], now_s, job)
  outcome = 'cancelled'
else
  local seq = redis.call('HGET', jk, 'seq')
  redis.call('HSET', jk, 'state', 'queued', 'reason', 'preempted by ' .. ARGV[4])
  redis.call('HDEL', jk, 'lease', 'token')
  redis.call('HINCRBY', jk, 'preemptions', 1)
  redis.call('ZADD', ARGV[3] .. ':queue:' .. string.lower(prio), tonumber(seq), job)
end
local ev = {ts = now_s, kind = 'preempted', lease = ARGV[1], job = job, priority = prio, gpus = gpus,
            by = ARGV[4], outcome = outcome}
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
return {1, outcome}
"""


def preempt(r: redis.Redis, keys: Keys, lease_id: str, by_job: str, planner_token: str = "") -> str:
    """Preempt the job holding ``lease_id`` in favour of ``by_job``: its GPUs are freed
    at once (its holder's later writes fail the fencing check) and it is requeued with
    its original submission order (or cancelled, if a cancel was requested).

    Returns:
        ``"preempted"`` or ``"cancelled"``; or why nothing was done: ``"gone"``,
        ``"not_a_job"``, ``"executed"`` (its workload already ran: it only has to clear).
    Raises:
        LeaseError: ``planner_token`` is stale (another planner leads).
    """
    script = r.register_script(_PREEMPT)
    out = script(keys=[keys.lease(lease_id), keys.leases, keys.running, keys.events, keys.planner_fence,
                       f"{keys.prefix}:finished"],
                 args=[lease_id, now_ms(), keys.prefix, by_job, planner_token])
    if out[0] == 0 and out[1] == "planner_fenced":
        raise LeaseError("planner fencing token is stale: another planner leads")
    return out[1]
