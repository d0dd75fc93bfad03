"""Starting planned jobs for the planner worker: lease, then send the phase chain.

:meth:`StartMixin._start_many` leases every (job, GPUs, planned end in workload s, load)
that a tick starts now, in order: one :meth:`makespan.workers.leases.LeaseStore.acquire_many`
round trip (each lease its own atomic script, the job acknowledged in the same step),
or one ``allocate_gpus`` span per lease when tracing is on (:meth:`StartMixin._start`,
also the preemption and restore paths' way to start one job). For every lease
published, ``_started`` records the wait metric and sends the job's phase chain to its
host's queue (``_send``: the injected ``dispatch`` or :func:`makespan.workers.tasks.dispatch`).
A send that fails is logged, not raised: the lease is never renewed, so it expires and
the reaper requeues the job.

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`; uses its leases, keys,
settings, fleet, fencing token, ``_meta`` and ``now_s``.
"""

from __future__ import annotations

import logging
import time
import uuid

from makespan import metrics, telemetry
from makespan.errors import LeaseError
from makespan.models import Priority
from makespan.planner.model import PlanJob
from makespan.workers.phases import PhaseContext, instance_value

log = logging.getLogger("makespan.planner")


class StartMixin:
    def _start_many(self, starts: list[tuple[PlanJob, tuple[str, ...], float, str]]) -> set[str]:
        """Lease and send every (job, gpus, planned end, load) of ``starts``, in order;
        the leases in one round trip (each its own atomic script) unless tracing is on
        (then one ``allocate_gpus`` span per lease). Returns the ids of the jobs started.

        Raises:
            LeaseError: the planner was fenced off (after sending what it leased before).
        """
        if len(starts) <= 1 or telemetry.tracing_enabled():
            return {s[0].id for s in starts if self._start(*s)}
        reqs = [self._lease_request(*s) for s in starts]
        leases, fenced = self.leases.acquire_many(reqs)
        started = {s[0].id for s, q, lease in zip(starts, reqs, leases) if lease is not None and self._started(
            s[0], s[1], q["holder"], lease)}
        if fenced:
            raise LeaseError("planner fencing token is stale: another planner leads")
        return started

    def _own_priority(self, j: PlanJob) -> Priority:
        """The level ``j`` was submitted at (its queue and record), which may be below the
        level it is planned at (priority through dependencies, :mod:`makespan.workers.batch`)."""
        own = getattr(self, "_own_level", {}).get(j.id)
        return own if own is not None else Priority(j.priority)

    def _lease_request(self, j: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> dict:
        """The :meth:`LeaseStore.acquire` arguments of a job lease."""
        prio = self._own_priority(j)
        host = self.fleet.host_of(gpus[0])
        return dict(lease_id=uuid.uuid4().hex, gpus=gpus, ttl_s=self.settings.lease_ttl_s, job_id=j.id, kind="job",
                    holder=host, queue=self.keys.queue(prio), planner_token=self.token,
                    info={"planned_end_s": repr(end_s), "endpoint": j.endpoint, "priority": prio.name},
                    event={"endpoint": j.endpoint, "priority": prio.name, "host": host, "load": load,
                           "planned_s": end_s - self.now_s()}, instance=instance_value(j.endpoint, gpus))

    def _start(self, j: PlanJob, gpus: tuple[str, ...], end_s: float, load: str) -> bool:
        """Lease ``gpus`` for job ``j`` and send its phase chain. False if the lease failed."""
        q = self._lease_request(j, gpus, end_s, load)
        tp = self._meta.get(j.id, ("", 0.0))[0]
        attrs = {"job_id": j.id, "priority": self._own_priority(j).name, "endpoint": j.endpoint, "gpus": list(gpus),
                 "host": q["holder"], "lease_id": q["lease_id"], "planned_s": end_s - self.now_s()}
        with telemetry.phase_span("allocate_gpus", tp, attrs):
            lease = self.leases.acquire(**q)
        return lease is not None and self._started(j, gpus, q["holder"], lease)

    def _started(self, j: PlanJob, gpus: tuple[str, ...], host: str, lease) -> bool:
        """After ``lease`` was published for ``j``: metrics, and send its phase chain."""
        prio = self._own_priority(j)
        lid = lease.lease_id
        tp, sub = self._meta.get(j.id, ("", 0.0))
        if sub:
            metrics.observe_wait(prio, max(0.0, time.time() - sub))
        levels = getattr(self, "_planned_sleep", {}).get(j.id)  # the plan's transition choice
        ctx = PhaseContext(lid, lease.token, list(gpus), host, "job", j.endpoint, j.id, prio.name, j.service_s,
                           traceparent=tp, submitted_at=sub, sleep_levels=levels)
        for g in gpus:
            self._last_tp[g] = tp
        with telemetry.use_traceparent(tp):
            self._send(ctx, host, lease.warm)
        return True

    def _send(self, ctx: PhaseContext, host: str, warm: bool = False) -> None:
        """Send the phase chain. A publish that fails (broker connection lost mid-send;
        kombu may raise more than redis errors then) must not kill the planner: the
        lease is never renewed, so it expires and the reaper requeues the job."""
        try:
            if self._dispatch is not None:
                self._dispatch(ctx, self.keys.host_queue(host))
            else:
                from makespan.workers.tasks import dispatch

                dispatch(ctx, self.keys.host_queue(host), warm)
        except Exception as e:  # noqa: BLE001 - recovered through lease expiry, see above
            log.error("dispatch of lease %s (job %s) failed: %r; it will expire and be reclaimed",
                      ctx.lease_id, ctx.job_id or ctx.kind, e)
