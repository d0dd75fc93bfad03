"""GPU leases: gang acquire, heartbeat renew, fencing check, release and reclaim.

Each operation is one Lua script, so a gang is leased whole or not at all and a job
is acknowledged (removed from its queue) in the same step that publishes its lease.

Per GPU, ``P:gpu:{uuid}`` holds ``{lease_id}:{token}`` with a PX expiry; the token is
a fencing token from the monotonic counter ``P:fence`` (Kleppmann, "How to do
distributed locking", 2016). A holder acts only while every GPU of its gang still
names its lease and token; a reclaimed or expired lease makes its later writes no-ops.

One clock decides lease time: the Redis server's. Each script reads ``TIME`` itself
(``server_now_ms()`` of ``makespan/store/lua/lib.lua``; allowed in Redis >= 5 scripts, which
replicate effects) to compute ``expires_ms`` (unix ms, the score in ``P:leases``) on
acquire and renew and to compare it on :meth:`LeaseStore.expired` and reclaim, exactly as the GPU keys' PX
expiry runs on that clock. Planner and GPU workers on hosts whose clocks disagree then
agree on when a lease expires: a planner whose clock runs ahead does not reclaim a live
lease (the job would run twice), one that runs behind does not leak GPUs for the skew.
Event timestamps (``ts``, ``leased_at``, ``finished_at``) stay on the caller's clock,
like every other event; they feed reports, not expiry decisions.

A planner reads the lease records another leader wrote on the server's clock as well
(:func:`held_s`, :func:`planned_end_s`): the acquire script writes ``granted_ms`` (``TIME``),
the planner writes the planned duration ``planned_s`` beside its own ``planned_end_s``, and a
reader compares ``granted_ms`` with ``TIME`` read in its own round trip. After a leader change
the new leader's free times and minimum runtimes are then off by no clock skew.

The store (:mod:`makespan.store.leases`) owns the scripts (``makespan/store/lua/*.lua``, each
with its KEYS and ARGV) and :class:`makespan.store.LeaseStore`; this module keeps the names the
workers import: :class:`Lease`, :class:`LeaseStore` (the store's, plus the job span of a job a
reclaim ends) and :func:`preempt`.
"""

from __future__ import annotations


import redis

from makespan.keys import Keys
from makespan.store import leases as _store_leases
from makespan.store.leases import Lease, delay_job_op, finish_job_op, now_ms, start_job_op

__all__ = ["Lease", "LeaseStore", "delay_job_op", "finish_job_op", "held_s", "now_ms", "planned_end_s", "preempt",
           "server_time_ms", "start_job_op"]


def server_time_ms(server_time: tuple[int, int]) -> float:
    """Redis ``TIME`` (seconds, microseconds) as unix ms."""
    seconds, micros = server_time
    return int(seconds) * 1000.0 + int(micros) / 1000.0


def held_s(lease: dict[str, str], server_now_ms: float, time_scale: float, fallback_s: float) -> float:
    """Workload s the lease record ``lease`` has held its GPUs, on the Redis server's clock:
    ``server_now_ms`` (``TIME``, :func:`server_time_ms`) less its ``granted_ms`` (written by
    the acquire script from ``TIME``), ÷ ``time_scale``. So every planner measures the same
    time held, a new leader whose clock disagrees with the one that leased the job included.
    ``fallback_s`` for a lease record without ``granted_ms`` (acquired by an older makespan)."""
    granted_ms = lease.get("granted_ms")
    if not granted_ms:
        return fallback_s
    return (server_now_ms - float(granted_ms)) / 1000.0 / time_scale


def planned_end_s(lease: dict[str, str], now_s: float, server_now_ms: float, time_scale: float) -> float | None:
    """When the lease record ``lease`` is planned to end, in workload s on the caller's clock
    (``now_s``: the caller's workload now, read with ``server_now_ms``, ``TIME`` as unix ms):
    ``now_s`` less the time held on the server's clock (:func:`held_s`) plus its planned
    duration ``planned_s`` (workload s from the grant, written by the planner that leased it).
    So the planned end is the same instant for every planner, whatever the skew between its
    clock and the clock of the leader that leased it. A record without ``granted_ms`` or
    ``planned_s`` (an older makespan's, a hand-made one) gives its ``planned_end_s`` as written
    (on the writer's clock); None when it has neither."""
    planned_s = lease.get("planned_s")
    if lease.get("granted_ms") and planned_s:
        return now_s - held_s(lease, server_now_ms, time_scale, 0.0) + float(planned_s)
    written = lease.get("planned_end_s")
    return float(written) if written else None


def expected_end_s(planned_end: float, now_s: float) -> float:
    """When a holder planned to end at ``planned_end`` (workload s) is expected to end, seen
    at ``now_s``: its planned end, or for one past it, as long again as it has overrun (its
    release cannot be dated; a holder far past its planned end is not expected to end at the
    next tick). The planner's fleet state (:mod:`makespan.workers.fleet_view`) and the
    critical lane's free times both use it."""
    return planned_end if planned_end >= now_s else now_s + (now_s - planned_end)


class LeaseStore(_store_leases.LeaseStore):
    """:class:`makespan.store.LeaseStore`, plus the metrics and the job's root span of a job
    a reclaim or a preemption ends or requeues (every path that preempts calls
    :meth:`preempt` here: the tick's rule and scored preemptions and the critical lane)."""

    def job_ended(self, job_id: str, state: str) -> None:
        """A job a reclaim or a preemption ended (its GPU worker, which normally ends it, died,
        or its cancel was requested when it was preempted): counted completed or failed
        (``makespan_jobs_*_total``; a cancel is neither) and its ``makespan`` root span ended:
        one trace per job, whoever finishes it."""
        from makespan import metrics, telemetry

        record = dict(zip(telemetry.JOB_SPAN_FIELDS, self.r.hmget(self.keys.job(job_id), *telemetry.JOB_SPAN_FIELDS)))
        if state in ("completed", "failed") and record["priority"]:
            (metrics.job_completed if state == "completed" else metrics.job_failed)(record["priority"])
        telemetry.end_job_span_of_record(job_id, state, record)

    def job_preempted(self, job_id: str, priority: str) -> None:
        """A preemption requeued ``job_id``: ``makespan_jobs_preempted_total{priority}``."""
        from makespan import metrics

        metrics.job_preempted(priority or "LOW")


def preempt(r: redis.Redis, keys: Keys, lease_id: str, by_job: str, planner_token: str = "") -> str:
    """Preempt the job holding ``lease_id`` in favour of ``by_job``: its GPUs are freed
    at once (its holder's later writes fail the fencing check) and it is requeued with
    its original submission order (or cancelled, if a cancel was requested).
    :meth:`makespan.store.LeaseStore.preempt` on a store for ``r`` and ``keys`` (this
    module's: a requeued victim is counted in ``makespan_jobs_preempted_total``, a
    cancelled one's root span is ended).

    Returns:
        ``"preempted"`` or ``"cancelled"``; or why nothing was done: ``"gone"``,
        ``"not_a_job"``, ``"not_leased"`` (its job is queued, delayed or final),
        ``"executed"`` (its workload already ran: it only has to clear),
        ``"preemptor_not_queued"`` (``by_job`` was leased or ended meanwhile).
    Raises:
        LeaseError: ``planner_token`` is stale (another planner leads).
        StoreError: Redis failed.
    """
    return LeaseStore(r, keys).preempt(lease_id, by_job, planner_token)
