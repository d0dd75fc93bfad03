"""Delayed jobs: kept in Redis until due, then queued by the planner.

A job submitted with ``delay_s`` (makespan.producer) and a job whose lease was reclaimed while
``retry_backoff_s`` > 0 (makespan.workers.leases) are ``delayed``: their id sits in ``P:delayed``
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

Due times are on the Redis server's clock (unix s): the submit script (makespan.producer)
and the reclaim script (makespan.workers.leases) compute them from ``TIME``, and the promote
script compares them with ``TIME``, so a producer, a GPU host and a planner whose clocks
disagree still queue a job when it is due, not the skew early or late. The planner's
sleep (:meth:`DelayedJobs.wait_s`) converts to its own clock with the offset measured
at the last promote.
"""

from __future__ import annotations

import time

import redis

from makespan.keys import Keys
from makespan.workers.lease_scripts import SERVER_NOW_MS

PROMOTE_BATCH = 1_000  # most due jobs queued per planner tick

# KEYS: delayed, planner_fence, events ; ARGV: event ts (caller's clock, unix s), limit, prefix,
# planner token ('' = unchecked), ahead_s (due by server clock + ahead_s; tests only, else '0')
# Returns {queued count, next due time or '', server clock (unix s, as a string)};
# {-1, '', server clock} when the planner is fenced off.
_PROMOTE = SERVER_NOW_MS + """
local server_now_s = string.format('%.6f', server_now_ms / 1000.0)
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return {-1, '', server_now_s} end
local by = server_now_ms / 1000.0 + tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', by, 'LIMIT', 0, tonumber(ARGV[2]))
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
return {n, nxt[2] or '', server_now_s}
"""


class DelayedJobs:
    """Promotion of due delayed jobs on one Redis and key prefix."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self._promote = r.register_script(_PROMOTE)
        self.next_due: float | None = None  # unix s (server clock) of the earliest job still delayed
        self.server_offset_s = 0.0  # server clock − this host's clock, s, measured at the last promote

    def promote(self, planner_token: str = "", limit: int = PROMOTE_BATCH, *, ahead_s: float = 0.0) -> int:
        """Queue up to ``limit`` delayed jobs due by now on the Redis server's clock (plus
        ``ahead_s`` seconds: a test's way to reach a due time without waiting; the planner
        passes nothing). Returns how many were queued (0 when ``planner_token`` is stale)
        and sets :attr:`next_due` and :attr:`server_offset_s`.

        Raises:
            ValueError: ``ahead_s`` is negative or not finite.
            redis.RedisError: Redis failed (the planner loop treats it as a failed tick)."""
        if not 0.0 <= ahead_s < float("inf"):
            raise ValueError(f"ahead_s must be finite and >= 0, got {ahead_s!r}")
        out = self._promote(keys=[self.keys.delayed, self.keys.planner_fence, self.keys.events],
                            args=[repr(time.time()), limit, self.keys.prefix, planner_token, repr(float(ahead_s))])
        self.server_offset_s = float(out[2]) - time.time()
        self.next_due = float(out[1]) if out[1] not in ("", b"") else None
        return max(0, int(out[0]))

    def server_now_s(self) -> float:
        """The Redis server's clock (unix s) as estimated on this host from the offset
        measured at the last :meth:`promote` (error: one round trip)."""
        return time.time() + self.server_offset_s

    def note_due(self, due: float) -> None:
        """A job was made delayed until ``due`` (unix s, server clock) after the last
        :meth:`promote` (a reclaim with retry backoff): sleep no longer than that either."""
        self.next_due = due if self.next_due is None else min(self.next_due, due)

    def wait_s(self, tick_s: float) -> float:
        """How long the planner may sleep: ``tick_s``, or less when a delayed job falls due
        sooner (at least 1 ms)."""
        if self.next_due is None:
            return tick_s
        return max(0.001, min(tick_s, self.next_due - self.server_now_s()))

    def count(self) -> int:
        """Jobs still delayed."""
        return int(self.r.zcard(self.keys.delayed))
