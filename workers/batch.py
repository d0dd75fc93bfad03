"""Batch formation for the planner worker: which queued jobs a tick plans.

:meth:`BatchMixin.form_batch` takes up to ``batch_size`` queued jobs as
:class:`makespan.planner.model.PlanJob` (release and deadline in workload seconds), CRITICAL
first (strict priority), FIFO (``seq``) within a level. It reads each queue
(``P:queue:{level}``) in chunks of ``batch_size``, at most ``SCAN_FACTOR`` chunks per
level per tick, past steps whose dependencies are not done (their dependencies join
``awaited``: never preemption victims). When workloads are active and the queue heads
were not read with the tick's snapshot, it first runs one workload pass
(:func:`makespan.workloads.advance_workloads`). On the way it drops queue entries whose job
is no longer queued (``drop_stale.lua``) and cancels queued jobs whose dependency failed,
was cancelled or is gone, unless a failed workload step will be retried
(``cancel_dependant.lua``); both scripts are fenced by the planner token, so a deposed
planner changes nothing. It also notes each taken job's traceparent and
submission time (unix s) in ``_meta``.

Priority through dependencies (docs/planner.md "Guarantees"): a job that a
higher-priority queued or delayed job waits on, directly or through a chain of
``depends_on`` / DAG steps, is planned at the highest level waiting on it (its
``PlanJob.weight`` and ``priority``), for as long as that dependant waits. The dependants
come from the reverse-dependency index ``P:awaited:{job}`` (:mod:`makespan.awaited`), walked
upward in one script per tick (``inherited_levels.lua``); a cancelled dependant leaves the index,
so its inheritance is gone at the next tick. A dependency of an unready step seen in the
batch's scan is pulled into the batch at the step's level even when its own queue is not
read this tick (:meth:`BatchMixin._pull_dependencies`). ``_own_level`` keeps each job's
submitted level: its queue, lease and metrics use that one.

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`; uses its Redis client, keys,
settings and fencing token.
"""

from __future__ import annotations

import dataclasses
import json
import time

from makespan.models import Priority
from makespan.planner.model import PlanJob
from makespan.store import JobStore

SCAN_FACTOR = 4  # queue entries read per level per tick: at most SCAN_FACTOR × batch_size
MAX_DEP_DEPTH = 8  # levels of depends_on followed down from an unready step to pull its dependencies in
MAX_WAITERS_WALKED = 1000  # dependants read per job when walking P:awaited upward (bounds the script)

class BatchMixin:
    _removed = 0  # queue entries removed (stale, cancelled) while form_batch read the current chunk

    def form_batch(self, heads: dict[Priority, list[str]] | None = None) -> list[PlanJob]:
        """Up to ``batch_size`` queued jobs, CRITICAL first (strict priority), FIFO within a
        level. ``heads``: the first ``batch_size`` ids of each queue, already read (they
        are read again here when a workload pass may have changed the queues)."""
        out: list[PlanJob] = []
        self._meta: dict[str, tuple[str, float]] = {}
        self._own_level: dict[str, Priority] = {}  # job id -> its submitted level (queue, lease, metrics)
        self.awaited: set[str] = set()  # deps of the unready steps read here (never victims; plus the index)
        self._unready_level: dict[str, int] = {}  # dependency id -> highest level of an unready step seen on it
        self._unready: dict[str, tuple[str, ...]] = {}  # unready steps read -> their deps (wait reasons)
        self._left_out: dict[str, tuple[Priority, int]] = {}  # read, queued, not taken -> (level, queue position)
        self._requeued: set[str] = set()  # taken jobs whose record says they were preempted
        room = self.settings.batch_size
        if heads is None and self.r.scard(self.keys.workloads_active):
            from makespan.workloads import advance_workloads  # workload steps: retries, failure, completion

            advance_workloads(self.r, self.keys)
        for lvl in Priority:
            offset = 0
            # read on past steps whose dependencies are not done, so that they never hide
            # startable jobs behind them (bounded: SCAN_FACTOR batches per level per tick);
            # what a step waits on is known at any depth from the index (makespan.awaited)
            while room > 0 and offset < SCAN_FACTOR * self.settings.batch_size:
                if offset == 0 and heads is not None:
                    ids = heads[lvl]
                else:
                    ids = self.r.zrange(self.keys.queue(lvl), offset, offset + self.settings.batch_size - 1)
                if not ids:
                    break
                self._removed = 0
                room = self._take(lvl, ids, out, room, offset)
                offset += len(ids) - self._removed  # entries removed meanwhile: the rest moved up
        self._pull_dependencies(out)
        return self._inherit(out)

    def _inherit(self, out: list[PlanJob]) -> list[PlanJob]:
        """``out`` with each job raised to the highest level waiting on it (P:awaited)."""
        if not out:
            return out
        best = JobStore(self.r, self.keys).inherited_levels([j.id for j in out], MAX_WAITERS_WALKED)
        res = []
        for j, lvl in zip(out, best):
            lvl = int(lvl)
            if lvl < j.priority:
                j = dataclasses.replace(j, priority=lvl, weight=max(j.weight, float(Priority(lvl).weight)))
            res.append(j)
        return res

    def _pull_dependencies(self, out: list[PlanJob]) -> None:
        """Append to ``out`` the queued, ready jobs that the unready steps read this tick wait
        on (down chains of queued dependencies, at most :data:`MAX_DEP_DEPTH` levels) and
        that are not in it yet, so a LOW job a CRITICAL step waits on is planned although the
        LOW queue is not read this tick. At most ``batch_size`` such jobs."""
        have = {j.id for j in out}
        frontier = [d for d in self._unready_level if d not in have]
        seen = set(frontier)
        room = self.settings.batch_size
        for _ in range(MAX_DEP_DEPTH):
            if not frontier or room <= 0:
                return
            p = self.r.pipeline(transaction=False)
            for jid in frontier:
                p.hmget(self.keys.job(jid), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                        "traceparent", "deadline_s", "priority")
            nxt = []
            for jid, (ep, svc, sub, seq, deps, state, tp, due, prio) in zip(frontier, p.execute()):
                if ep is None or state != "queued" or prio not in Priority.__members__:
                    continue
                dl = tuple(json.loads(deps)) if deps else ()
                if dl and not all(self.r.hget(self.keys.job(d), "state") == "completed" for d in dl):
                    self.awaited.update(dl)
                    for d in dl:
                        if d not in seen and d not in have:
                            seen.add(d)
                            nxt.append(d)
                    continue
                if room <= 0:
                    continue
                self._left_out.pop(jid, None)
                out.append(self._plan_job(jid, Priority[prio], ep, svc, sub, seq, tp, due))
                have.add(jid)
                room -= 1
            frontier = nxt

    def _plan_job(self, jid: str, lvl: Priority, ep: str, svc: str, sub: str, seq: str, tp: str | None,
                  due: str | None) -> PlanJob:
        """The PlanJob of a queued job at its own level (its meta and level noted), from its
        record's fields (strings as Redis answers them)."""
        r_s = float(sub) / self.settings.time_scale  # workload clock; service and deadline are workload s
        self._meta[jid] = (tp or "", float(sub))
        self._own_level[jid] = lvl
        return PlanJob(jid, ep, float(lvl.weight), r_s, float(svc), int(lvl), (),
                       r_s + float(due) if due else None, int(seq))

    def _take(self, lvl: Priority, ids: list[str], out: list[PlanJob], room: int, offset: int = 0) -> int:
        p = self.r.pipeline(transaction=False)
        for jid in ids:
            p.hmget(self.keys.job(jid), "endpoint", "service_s", "submitted_at", "seq", "deps", "state",
                    "traceparent", "deadline_s", "reason")
        for i, (jid, (ep, svc, sub, seq, deps, state, tp, due, why)) in enumerate(zip(ids, p.execute())):
            if ep is None or state != "queued":
                self._drop_stale(self.keys.queue(lvl), jid)  # cancelled or lost record
                continue
            dl = tuple(json.loads(deps)) if deps else ()
            if room <= 0:  # not in the batch (what it waits on is in the index)
                self._left_out[jid] = (lvl, offset + i)
                continue
            if dl and not self._deps_ready(jid, dl):
                self.awaited.update(dl)
                self._unready[jid] = dl
                for d in dl:
                    self._unready_level[d] = min(self._unready_level.get(d, 4), int(lvl))
                continue
            out.append(self._plan_job(jid, lvl, ep, svc, sub, seq, tp, due))
            if why and why.startswith("preempted by"):
                self._requeued.add(jid)
            room -= 1
        return room

    def _drop_stale(self, queue: str, jid: str) -> None:
        """Remove a queue entry whose job is no longer queued — only while this planner
        still leads and the job is still not queued (a reaper may have requeued it since)."""
        self._removed += JobStore(self.r, self.keys).drop_stale(queue, jid, self.token)

    def _deps_ready(self, jid: str, deps: tuple[str, ...]) -> bool:
        states = [self.r.hget(self.keys.job(d), "state") for d in deps]
        if all(s == "completed" for s in states):
            return True
        bad = [d for d, s in zip(deps, states) if s in ("failed", "cancelled") or s is None]
        if bad and "failed" in states:
            from makespan.workloads import retry_pending  # a workload step that will be retried: wait

            bad = [d for d in bad if not retry_pending(self.r, self.keys, d)]
        if bad:
            prio = self.r.hget(self.keys.job(jid), "priority") or "NORMAL"
            reason = f"dependency {bad[0]} did not complete"
            ev = json.dumps({"ts": time.time(), "kind": "cancelled", "job": jid, "priority": prio, "reason": reason})
            self._removed += JobStore(self.r, self.keys).cancel_dependant(jid, self.keys.queue(prio), self.token,
                                                                          time.time(), reason, ev)
        return False
