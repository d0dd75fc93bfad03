"""Delayed jobs: kept in Redis until due, then queued by the planner.

A job submitted with ``delay_s`` (app.producer) and a job whose lease was reclaimed while
``retry_backoff_s`` > 0 (workers.leases) are ``delayed``: their id sits in ``P:delayed``
(a sorted set scored by due time, unix s) and their record holds ``not_before``. Nothing
about them reaches Celery: a GPU worker holds no message, no countdown/eta, for a job
that is not due — the known failure of Celery countdowns on the Redis transport (a
message whose countdown exceeds the visibility timeout is delivered again, and every
waiting eta message sits in worker memory) cannot happen.

Each planner tick the leader calls :meth:`DelayedJobs.promote`: one Lua script moves at
most ``limit`` due ids into their priority queue (score = submission seq, as any queued
job) and marks them ``queued``, only while the planner still leads and only jobs still
``delayed`` (a cancelled one is just dropped from the set): idempotent, atomic, bounded.
It returns the next due time, so the planner sleeps no longer than that.
"""

from __future__ import annotations

import time

import redis

from app.keys import Keys

PROMOTE_BATCH = 1_000  # most due jobs queued per planner tick

# KEYS: delayed, planner_fence, events ; ARGV: now (unix s), limit, prefix, planner token ('' = unchecked)
# Returns {queued count, next due time or ''}; {-1, ''} when the planner is fenced off.
_PROMOTE = """
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return {-1, ''} end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local jk = ARGV[3] .. ':job:' .. id
  local rec = redis.call('HMGET', jk, 'state', 'priority', 'seq')
  if rec[1] == 'delayed' then
    redis.call('HSET', jk, 'state', 'queued')
    redis.call('ZADD', ARGV[3] .. ':queue:' .. string.lower(rec[2]), tonumber(rec[3]), id)
    local ev = {ts = tonumber(ARGV[1]), kind = 'promoted', job = id, priority = rec[2]}
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', '1000000', '*', 'e', cjson.encode(ev))
    n = n + 1
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {n, nxt[2] or ''}
"""


class DelayedJobs:
    """Promotion of due delayed jobs on one Redis and key prefix."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self._promote = r.register_script(_PROMOTE)
        self.next_due: float | None = None  # unix s of the earliest job still delayed

    def promote(self, planner_token: str = "", now: float | None = None, limit: int = PROMOTE_BATCH) -> int:
        """Queue up to ``limit`` delayed jobs due by ``now`` (unix s; default: the clock).
        Returns how many were queued (0 when ``planner_token`` is stale) and sets
        :attr:`next_due`.

        Raises:
            redis.RedisError: Redis failed (the planner loop treats it as a failed tick)."""
        out = self._promote(keys=[self.keys.delayed, self.keys.planner_fence, self.keys.events],
                            args=[repr(time.time() if now is None else now), limit, self.keys.prefix, planner_token])
        self.next_due = float(out[1]) if out[1] not in ("", b"") else None
        return max(0, int(out[0]))

    def note_due(self, due: float) -> None:
        """A job was made delayed until ``due`` (unix s) after the last :meth:`promote`
        (a reclaim with retry backoff): sleep no longer than that either."""
        self.next_due = due if self.next_due is None else min(self.next_due, due)

    def wait_s(self, tick_s: float) -> float:
        """How long the planner may sleep: ``tick_s``, or less when a delayed job falls due
        sooner (at least 1 ms)."""
        if self.next_due is None:
            return tick_s
        return max(0.001, min(tick_s, self.next_due - time.time()))

    def count(self) -> int:
        """Jobs still delayed."""
        return int(self.r.zcard(self.keys.delayed))
