"""Set-point restore and the drain check of the planner worker.

When nothing is queued or running, the leader restores every set-point instance that
is not resident (a restore lease and an evict → restore chain per GPU group). While jobs
are queued, it starts the restores of its plan that start now (a set-point group the
plan leaves idle, free and not at its set point: :meth:`SetPointMixin._restore_planned`).
Once
the fleet is back at its set point it counts what a drained fleet must not hold:
leases, agenda entries, busy slots, and reverse-dependency index entries whose waiting
job is no longer queued or delayed (``awaited_entries``, :func:`makespan.awaited.leaked`).

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from makespan import events, telemetry
from makespan.awaited import leaked
from makespan.planner.restore import plan_restores
from makespan.workers.phases import PhaseContext, instance_value

log = logging.getLogger("makespan.planner")
NOW_TOL_S = 1e-3  # workload s: a planned restore starting within this of the tick's now starts now


class SetPointMixin:
    def _idle(self, busy: set[str]) -> bool:
        """Restore set points and check the drain once per idle period (module doc). A
        period ends when work runs or is queued again, so every batch gets its check."""
        if self.r.zcard(self.keys.running) or any(self.r.zcard(q) for q in self.keys.queues()):
            self._idle_checked = False
            return False
        restoring = False
        res = dict(zip([g.uuid for g in self.gpus], self.r.mget([self.keys.resident(g.uuid) for g in self.gpus])))
        for ep, gpus in self.set_points:
            want = instance_value(ep, gpus)
            if all(res.get(g) == want for g in gpus):
                continue
            restoring = True
            if busy.intersection(gpus):
                continue
            self._start_restore(ep, tuple(gpus), busy)
        if restoring or self.r.zcard(self.keys.leases):
            self._idle_checked = False
            return False
        if not self._idle_checked:
            self._idle_checked = True
            self.check_drain()
        return False

    def _start_restore(self, ep: str, gpus: tuple[str, ...], busy: set[str]) -> bool:
        """Lease ``gpus`` for the restore of set-point ``ep`` and send its evict → restore
        chain; the GPUs join ``busy``. False if the lease failed (GPUs taken meanwhile)."""
        lid = uuid.uuid4().hex
        host = self.fleet.host_of(gpus[0])
        cold = self.fleet.endpoints[ep].cold_start_s
        lease = self.leases.acquire(lid, gpus, self.settings.lease_ttl_s, job_id=f"restore:{ep}:{gpus[0]}",
                                    kind="restore", holder=host, planner_token=self.token,
                                    info={"planned_end_s": repr(self.now_s() + cold), "endpoint": ep},
                                    event={"kind": "restore_start", "endpoint": ep, "host": host,
                                           "planned_s": cold})
        if lease is None:
            return False
        busy.update(gpus)
        # the restore joins the trace of the last job that held these GPUs: its
        # restore_baseline span closes that job's makespan (submit -> restore)
        tp = next((self._last_tp[g] for g in gpus if self._last_tp.get(g)), "")
        with telemetry.use_traceparent(tp):
            self._send(PhaseContext(lid, lease.token, list(gpus), host, "restore", ep, traceparent=tp), host)
        for g in gpus:
            self._last_tp.pop(g, None)
        return True

    def _restore_planned(self, batch: list, state: Any, p: Any, taken: set[str]) -> int:
        """Start the plan's set-point restores that start now (planner/restore.py, at the
        group's last planned job: a group the plan leaves idle, free now and not at its
        set point), while other jobs are queued. Only when the batch holds every queued
        job (fewer than ``batch_size``): a job left out of the batch might need the GPUs.
        For the same reason the tick does not call it after a preemption requeued victims
        (they are queued, not in the batch, and may start on those GPUs next tick).
        Jobs waiting on a dependency are not in the batch and are not considered. Returns
        the restores started; their GPUs join ``taken``."""
        if len(batch) >= self.settings.batch_size:
            return 0
        # "now": an idle group's restore starts exactly at state.now_s (its GPUs free now); an
        # absolute tolerance, as a relative one (1e-6 of a unix time ≈ 1800 s) started restores
        # planned after a job still waiting for the group, delaying that job
        n = 0
        for a in plan_restores(p.assignments, batch, state, "group"):
            if a.start_s <= state.now_s + NOW_TOL_S and not taken.intersection(a.gpus):
                n += self._start_restore(state.set_point[a.gpus[0]], tuple(a.gpus), taken)
        return n

    def check_drain(self) -> dict[str, Any]:
        """Count what a drained fleet must not hold: leases, agenda entries, busy slots,
        leaked reverse-dependency index entries (module doc)."""
        gpu_keys = sum(1 for v in self.r.mget([self.keys.gpu(g.uuid) for g in self.gpus]) if v)
        leases = int(self.r.zcard(self.keys.leases)) + gpu_keys
        agenda = self.agenda.count() if self.agenda is not None else 0
        busy_slots = sum(1 for _ in self.r.scan_iter(self.keys.busy_pattern, count=1000))
        awaited = sum(len(v) for v in leaked(self.r, self.keys).values())
        counts = {"leases": leases, "agenda_entries": agenda, "busy_slots": busy_slots, "awaited_entries": awaited}
        self.r.hset(self.keys.drain, mapping={**counts, "checked_at": repr(time.time())})
        self.r.hincrby(self.keys.drain, "checks", 1)
        events.record(self.r, self.keys.events, "drain", **counts)
        if any(counts.values()):
            log.error("drain check: left behind %s (leases %s)", counts, self.leases.active())
        else:
            log.info("drain check: clean")
        return counts
