"""The planner worker's clock, injected (Kueue's ``WithClock`` is the model).

Every reading of the planner's own clock on the tick's path goes through a
:class:`Clock`: ``now()`` (unix seconds: the workload clock ``now_s`` is it divided by
``time_scale``, event timestamps, waiting times) and ``monotonic()`` (seconds from an
arbitrary origin: durations such as a solve's, refresh intervals). Production uses
:class:`SystemClock`; a test passes a :class:`ManualClock` and moves it with
:meth:`ManualClock.advance` instead of patching ``time.time`` or sleeping.

Times on the Redis server's clock (lease expiry, delayed jobs' due times) are not read
here: the scripts read ``TIME`` themselves. A lease's grant (the minimum runtime before
preemption, when its GPUs free) is compared with ``TIME`` read in the same round trip as
the lease records (:func:`makespan.workers.leases.planned_end_s`), so a leader's plans do
not depend on the clock of the leader that leased.
"""

from __future__ import annotations

import time
from typing import Protocol


NOW_TOL_S = 1e-3  # workload s: a planned start within this of the tick's now starts now
NOW_REL_TOL = 1e-13  # and within this fraction of now_s (a few hundred float ulps: see starts_now)


def release_s(submitted_at: str | float, not_before: str | float | None, time_scale: float, now_s: float) -> float:
    """A queued job's release on the workload clock (workload s), from its record's
    ``submitted_at`` and ``not_before`` (unix s; ``not_before`` is set when the job waited
    as a delayed job: ``delay_s``, a retry backoff): when it became available, so that a
    delay is not counted as waiting (the aging bound, weighted completion); ``now_s`` at the
    latest (a producer whose clock runs ahead must not make its job look released in the
    future: it would not start now)."""
    available = max(float(submitted_at), float(not_before) if not_before not in (None, "") else 0.0)
    return min(available / time_scale, now_s)


def starts_now(start_s: float, now_s: float) -> bool:
    """Whether an assignment planned to start at ``start_s`` (workload s) starts at the tick's
    ``now_s``: within ``NOW_TOL_S``, or within ``NOW_REL_TOL × |now_s|`` (the workload clock
    is unix time ÷ ``time_scale``: at ``time_scale`` 1e-4 it is ~1.8e13 and one float ulp
    is ~0.004 s). A plan's start later than that waits for a later tick, even on free GPUs:
    the plan put it behind something (a reservation, a gang waiting for a busy GPU)."""
    return start_s <= now_s + max(NOW_TOL_S, NOW_REL_TOL * abs(now_s))


class Clock(Protocol):
    """What the planner worker asks of a clock."""

    def now(self) -> float:
        """Unix time, s."""
        ...

    def monotonic(self) -> float:
        """A monotonic time, s, from an arbitrary origin (only differences mean anything)."""
        ...


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on the clock lease and leader-lock deadlines are kept on: ``CLOCK_BOOTTIME``
    where the OS has it (Linux: it also counts the time a suspended machine slept, as the
    Redis server's clock does, so a planner resumed after a VM suspend knows its lock ran
    out), else the monotonic clock. Both keep counting while the process is stopped."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


class SystemClock:
    """This host's clock: ``time.time``, and :func:`lease_clock` as its monotonic time."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return lease_clock()


class ManualClock:
    """A clock that moves only when told to (tests).

    Args:
        now_s: the unix time it starts at, s (e.g. ``time.time() + 60`` for a planner
            whose clock runs a minute ahead of the Redis server's).
        monotonic_s: the monotonic reading it starts at, s.
    """

    def __init__(self, now_s: float, monotonic_s: float = 0.0):
        self._now_s = float(now_s)
        self._monotonic_s = float(monotonic_s)

    def now(self) -> float:
        return self._now_s

    def monotonic(self) -> float:
        return self._monotonic_s

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back)."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r} s")
        self._now_s += seconds
        self._monotonic_s += seconds
