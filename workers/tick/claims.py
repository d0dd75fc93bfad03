"""Who may preempt for a queued job right now: the tick's ``Preempt`` step or the
critical lane (:mod:`makespan.workers.critical_lane`), never both.

Both run in the leading planner process, on different threads. Leases themselves need no
such guard (the acquire script refuses a job that is no longer queued and a GPU that is
held), but a preemption does: two deciders could each preempt a victim for the same
CRITICAL job, and the second victim would be requeued for nothing. A job id is held by at
most one of them at a time; the other skips it (the tick) or waits for it (the lane). A
job the lane leased stays **settled** (the last :data:`SETTLED_KEEP`): the tick's batch may
still hold it as waiting, and must not preempt for it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["SETTLED_KEEP", "JobClaims"]

SETTLED_KEEP = 4096  # settled job ids remembered (a tick's batch is at most a few hundred)


class JobClaims:
    """A set of job ids held by one decider at a time (thread-safe)."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._settled: dict[str, None] = {}  # insertion-ordered: the oldest are dropped first
        self._changed = threading.Condition()

    def take_free(self, job_ids: Iterable[str]) -> set[str]:
        """Hold every id of ``job_ids`` that nobody holds; returns those (the caller
        :meth:`release` s them when done)."""
        with self._changed:
            taken = {job_id for job_id in job_ids if job_id not in self._held and job_id not in self._settled}
            self._held |= taken
            return taken

    def take(self, job_id: str, timeout_s: float) -> bool:
        """Hold ``job_id``, waiting up to ``timeout_s`` s while another holds it. True when held."""
        with self._changed:
            if not self._changed.wait_for(lambda: job_id not in self._held, timeout_s):
                return False
            self._held.add(job_id)
            return True

    def release(self, job_ids: Iterable[str], settled: bool = False) -> None:
        """Give back ids held by :meth:`take` or :meth:`take_free`; ``settled``: they were
        leased, and :meth:`take_free` never hands them out again."""
        with self._changed:
            for job_id in job_ids:
                self._held.discard(job_id)
                if settled:
                    self._settled[job_id] = None
            while len(self._settled) > SETTLED_KEEP:
                del self._settled[next(iter(self._settled))]
            self._changed.notify_all()
