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
from makespan.store import JobStore

PROMOTE_BATCH = 1_000  # most due jobs queued per planner tick

class DelayedJobs:
    """Promotion of due delayed jobs on one Redis and key prefix."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self.jobs = JobStore(r, keys)
        self.next_due: float | None = None  # unix s (server clock) of the earliest job still delayed
        self.server_offset_s = 0.0  # server clock − this host's clock, s, measured at the last promote

    def promote(self, planner_token: str = "", limit: int = PROMOTE_BATCH, *, ahead_s: float = 0.0) -> int:
        """Queue up to ``limit`` delayed jobs due by now on the Redis server's clock (plus
        ``ahead_s`` seconds: a test's way to reach a due time without waiting; the planner
        passes nothing). Returns how many were queued (0 when ``planner_token`` is stale)
        and sets :attr:`next_due` and :attr:`server_offset_s`.

        Raises:
            ValueError: ``ahead_s`` is negative or not finite.
            StoreError: Redis failed (also a redis.RedisError: the planner loop treats it as a failed tick)."""
        if not 0.0 <= ahead_s < float("inf"):
            raise ValueError(f"ahead_s must be finite and >= 0, got {ahead_s!r}")
        queued, next_due, server_now = self.jobs.promote_delayed(time.time(), limit, planner_token, ahead_s)
        self.server_offset_s = float(server_now) - time.time()
        self.next_due = float(next_due) if next_due else None
        return max(0, queued)

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
