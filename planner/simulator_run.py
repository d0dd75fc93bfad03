"""One simulation run's committed schedule and the steps that change it (:class:`_Run`).

:func:`makespan.planner.simulator.simulate` drives it: at each planning point
:meth:`_Run.plan_point` plans the queue with :func:`makespan.planner.api.plan` (steps 2 to 5 of
the :mod:`makespan.planner.simulator` doc: commit, preempt by the plan's score or the fixed rule,
restore the set point) and :meth:`_Run.restore_if_idle` applies the idle restore rule.
It keeps the committed :class:`makespan.planner.replay.Replay`, the queue, one
:class:`makespan.planner.measures.JobRecord` per committed job (:func:`_record`), the restores,
the preempted attempts and the per-GPU residency changes the report reads. Times are
virtual seconds; no Redis, no wall clock except the solve times it records.
"""

from __future__ import annotations

import time
from typing import Any

from makespan.planner.api import plan
from makespan.planner.measures import JobRecord
from makespan.planner.model import Assignment, EndpointModel, FleetState, Plan, PlanJob, PlannedPreemption, RunningJob
from makespan.planner.policies import Policy
from makespan.planner.prewarm import prewarm_wakes
from makespan.planner.preemption import (DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_BUDGET, Holder,
                                         choose_preemption, victim_allowed)
from makespan.planner.replay import Group, Replay
from makespan.planner.sleepers import with_rule, with_upcoming


class _Run:
    """The committed schedule of one simulation and the steps that change it."""

    def __init__(self, base: FleetState, policy: Policy, window_s: float, max_batch: int, jobs: list[PlanJob],
                 set_points: list[tuple[str, Group]], preemption: str, time_limit_s: float | None = None,
                 preemption_budget: int = DEFAULT_PREEMPTION_BUDGET,
                 preemption_min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
                 reservation_after_s: float | None = None, lane_levels: dict[int, float] | None = None,
                 lane_start_grace_s: dict[int, float] | None = None):
        self.base, self.policy, self.window_s, self.max_batch = base, policy, window_s, max_batch
        self.preemption_budget, self.preemption_min_runtime_s = preemption_budget, preemption_min_runtime_s
        self.cut_count: dict[str, int] = {}  # job id -> times it was preempted (the budget)
        self.reservation_after_s = reservation_after_s  # the aging bound (makespan.planner.reservation)
        self.reserved_points = 0  # planning points whose plan held a reservation
        self.lane_levels = dict(lane_levels or {})  # the fast lane: level -> wait factor (makespan.planner.fast_lane)
        self.lane_start_grace_s = dict(lane_start_grace_s or {})  # lane levels bounded on start: grace s
        self.lane_preempt = True  # start-bounded lane jobs take the rule's preemptions (plan(lane_preempt=))
        self.lane_points = 0  # planning points whose plan the fast lane rebuilt
        # job id -> [(planning point t, planned start)], one entry per planning point whose plan held it
        # (the ETA a live job carries); the first entry is its ETA at submit
        self.etas: dict[str, list[tuple[float, float]]] = {}
        self.time_limit_s = time_limit_s
        self.set_points, self.preemption = set_points, preemption
        self.committed = Replay(base)
        self.ram_peak_mib = 0.0  # the most host RAM one host's sleepers held after a placement, MiB
        self.previous: Plan | None = None  # the last planning point's uncommitted plan
        self.queue: dict[str, PlanJob] = {}
        self.records: dict[str, JobRecord] = {}
        self.solve: list[float] = []
        self.placed: dict[str, tuple[PlanJob | None, Assignment]] = {}  # GPU -> its last placement
        self.restores: list[tuple[float, float, Group]] = []
        self.prewarm = False  # wake sleepers on idle groups ahead of demand (makespan.planner.prewarm)
        self.prewarms: list[tuple[float, float, Group]] = []
        self.lost: list[tuple[float, float, Group]] = []  # preempted attempts (start, cut, GPUs)
        self.preempted = 0
        self.log: list[dict[str, Any]] = []
        self.dependants = {d for j in jobs for d in j.deps}
        self.restore_at: str | None = None  # planned restores (makespan.planner.restore.RESTORE_AT), None: idle rule only
        # GPU -> residency changes (time_s, endpoint or None while in a transition), for set-point absence
        self.residency: dict[str, list[tuple[float, str | None]]] = {g.uuid: [] for g in base.gpus}

    def plan_point(self, t: float, demand: dict[str, float], share: dict[str, float]) -> float:
        """Plan the queue at ``t``, commit what starts before ``t + window_s``, then
        preempt for CRITICAL/HIGH jobs left waiting; after a preemption plan once more at
        ``t`` (the victims' other GPUs are free). Returns the earliest uncommitted start."""
        nxt = float("inf")
        for _ in range(2):
            batch = sorted(self.queue.values(), key=lambda j: (j.priority, j.seq))[:self.max_batch]
            c = self.committed
            state = FleetState(t, self.base.gpus, self.base.endpoints, free_at=dict(c.free_at),
                               resident=dict(c.resident), set_point=self.base.set_point, end_of=c.end_of,
                               asleep=dict(c.asleep), demand=demand, demand_share=share,
                               set_point_weight=self.base.set_point_weight, host_ram_mib=self.base.host_ram_mib,
                               asleep_level=dict(c.level))
            # the committed replay chooses transitions as this plan does (its forecast and rule)
            c.state = with_rule(with_upcoming(state, batch), self.policy.name) if c.level or any(
                e.sleep_options for e in state.endpoints.values()) else c.state
            scored = self.preemption == "plan" and self.policy.floor is not None
            if scored:
                state.running = self._running(t)
            c0 = time.perf_counter()
            p = plan(batch, state, self.policy, previous=self.previous, time_limit_s=self.time_limit_s,
                     preemption=scored, restore_at=self.restore_at, reserve_after_s=self.reservation_after_s,
                     lane_levels=self.lane_levels, lane_start_grace_s=self.lane_start_grace_s,
                     lane_preempt=self.lane_preempt)
            self.reserved_points += int(p.stats.get("reserved", 0.0))
            self.lane_points += int(p.stats.get("fast_lane_late", 0.0) > 0)
            self.solve.append(time.perf_counter() - c0)
            self._record_etas(t, p)
            bj = {j.id: j for j in batch}
            pre = {pp.job_id for pp in p.preemptions}
            for pp in p.preemptions:
                bj.update(self._apply(t, pp, bj[pp.job_id]))
            nxt = float("inf")
            later = []
            for a in sorted(p.assignments, key=lambda a: a.start_s):
                if a.job_id in pre:
                    continue
                if a.start_s < t + self.window_s:
                    self._place(bj[a.job_id], a.gpus, max(a.start_s, t))
                else:
                    nxt = min(nxt, a.start_s)
                    later.append(a)
            self.previous = Plan(p.policy, later)
            waiting = [j for j in batch if j.id in self.queue and j.priority <= 1]
            if scored or not (self.preemption and waiting and self._preempt(t, waiting)):
                # the plan's restores, after every job on their GPUs (those start before r: committed);
                # not after the rule preempted: its victims, back in the queue, were not in this
                # plan and may start on those GPUs (the next pass or planning point places them);
                # not when the batch is full, as live: a queued job left out may need the GPUs
                for r in p.restores if len(batch) < self.max_batch else ():
                    if r.start_s < t + self.window_s:
                        self._restore(tuple(r.gpus), state.set_point[r.gpus[0]], max(r.start_s, t))
                break
        return nxt

    def _record_etas(self, t: float, p: Plan) -> None:
        """Each queued job's planned start in ``p`` (a planned preemptor: ``at_s``), at ``t``;
        a second plan at the same point replaces the first's entry."""
        planned = {a.job_id: a.start_s for a in p.assignments}
        planned.update({pp.job_id: pp.at_s for pp in p.preemptions})
        for jid, eta in planned.items():
            h = self.etas.setdefault(jid, [])
            if h and h[-1][0] == t:
                h[-1] = (t, eta)
            else:
                h.append((t, eta))

    def _running(self, t: float) -> dict[str, RunningJob]:
        """GPU -> the committed job holding it at ``t`` (``FleetState.running``; restores
        are left out: never victims), preemptable as :meth:`_holder` says."""
        out: dict[str, RunningJob] = {}
        for u, f in self.committed.free_at.items():
            if f <= t:
                continue
            job, a = self.placed.get(u, (None, None))
            h = self._holder(u, t)
            if job is None or a is None or h is None:
                continue
            out[u] = RunningJob(job, tuple(a.gpus), a.start_s, a.service_start_s, a.end_s, h.preemptable)
        return out

    def _cut(self, t: float, v: str) -> PlanJob:
        """Preempt the committed job ``v`` at ``t``: cut it, drop its record, requeue it
        (original release and seq); its used GPU-seconds are lost. Returns it."""
        u0 = next(u for u, (job, _a) in self.placed.items() if job is not None and job.id == v)
        victim, a = self.placed[u0]
        assert victim is not None
        self.committed.unplace(a, t)
        if t < a.service_start_s and a.load != "warm":  # cut in its transition: nothing loaded
            for u in a.gpus:
                self.residency[u].pop()
        for u in a.gpus:
            del self.placed[u]
        del self.records[v]
        self.queue[v] = victim
        self.lost.append((a.start_s, t, a.gpus))
        self.preempted += 1
        self.cut_count[v] = self.cut_count.get(v, 0) + 1
        return victim

    def _apply(self, t: float, pp: PlannedPreemption, job: PlanJob) -> dict[str, PlanJob]:
        """A plan's preemption at ``t``, as :meth:`_preempt` does it: cut the victims,
        commit the preemptor on the group at ``t``. Returns the victims by id."""
        out = {v: self._cut(t, v) for v in pp.victims}
        self._place(job, tuple(pp.gpus), t)
        self.log.append({"t_s": t, "job": job.id, "victims": list(pp.victims), "gpus": list(pp.gpus),
                         "gain": pp.gain, **({"rule": True} if pp.rule else {})})
        return out

    def _place(self, job: PlanJob, gpus: Group, start_s: float) -> Assignment:
        a = self.committed.place(job, gpus, start_s)
        if self.committed.ram_used:  # host RAM its sleepers hold, MiB (only where it is modelled)
            self.ram_peak_mib = max(self.ram_peak_mib, max(self.committed.ram_used.values()))
        self._log_residency(a, job.endpoint)
        self.records[job.id] = _record(job, a, self.base)
        for u in gpus:
            self.placed[u] = (job, a)
        del self.queue[job.id]
        return a

    def _holder(self, u: str, t: float) -> Holder | None:
        job, a = self.placed.get(u, (None, None))
        if a is None or a.end_s <= t:
            return None
        if job is None:  # a restore
            return Holder(a.job_id, 3, False)
        # not yet started (committed while the queue was empty), another job needs its completion,
        # or a later job is committed on one of its GPUs (cutting it would free that GPU under it)
        last = all(self.placed.get(x, (None, None))[1] is a for x in a.gpus)
        bounded = victim_allowed(self.cut_count.get(job.id, 0), t - a.start_s, self.preemption_budget,
                                 self.preemption_min_runtime_s)  # the per-job budget and the minimum runtime
        return Holder(job.id, job.priority, a.start_s <= t and job.id not in self.dependants and last and bounded)

    def _preempt(self, t: float, waiting: list[PlanJob]) -> bool:
        """The preemption step at ``t`` (:func:`makespan.planner.preemption.choose_preemption`);
        True if anything was preempted."""
        c = self.committed
        busy = {u for u, f in c.free_at.items() if f > t}
        holders = {u: self._holder(u, t) for u in busy}
        cut = False
        for j in sorted(waiting, key=lambda j: (j.priority, j.seq)):
            if c.ready(j) > t:  # a dependency has not completed: it could not start now anyway
                continue
            ep = self.base.endpoints[j.endpoint]
            best = choose_preemption(j.priority, c.groups(ep), busy, c.free_at, t, ep.cold_start_s, holders)
            if best is None:
                continue
            for v in best.victims:
                for u in [u for u, h in holders.items() if h is not None and h.id == v]:
                    holders[u] = None
                    busy.discard(u)
                self._cut(t, v)
            self._place(j, best.group, t)
            self.log.append({"t_s": t, "job": j.id, "victims": list(best.victims), "gpus": list(best.group)})
            busy.update(best.group)
            holders.update({u: Holder(j.id, j.priority, False) for u in best.group})
            cut = True
        return cut

    def restore_if_idle(self, t: float, next_arrival_s: float) -> None:
        """Set-point restore as the live planner worker does it: once nothing is queued
        or running (here: when the committed work ends, if no job arrives before), every
        set-point instance not resident is restored (evict, then cold start or wake)."""
        idle_at = max([t, *self.committed.free_at.values()])
        if idle_at >= next_arrival_s:
            return
        for ep, g in self.set_points:
            if all(self.committed.resident[u] == ep for u in g):
                continue
            self._restore(g, ep, idle_at)

    def prewarm_point(self, t: float, share: dict[str, float], until_s: float) -> None:
        """Commit the prewarms of :func:`makespan.planner.prewarm.prewarm_wakes` at ``t``
        (groups free before ``until_s``, the next planning point; the uncommitted plan's
        GPUs excluded): each a restore-like wake, never a victim, counted in ``prewarms``."""
        c = self.committed
        state = FleetState(t, self.base.gpus, self.base.endpoints, free_at=dict(c.free_at), resident=dict(c.resident),
                           set_point=self.base.set_point, asleep=dict(c.asleep), demand_share=share,
                           asleep_level=dict(c.level))
        later = self.previous.assignments if self.previous is not None and self.queue else []
        planned = {u for a in later for u in a.gpus}
        for pw in prewarm_wakes(state, planned, {j.endpoint for j in self.queue.values()}, until_s):
            a = c.restore(pw.gpus, pw.endpoint, max(pw.start_s, c.group_free(pw.gpus)))
            self._log_residency(a, pw.endpoint)
            self.prewarms.append((a.start_s, a.end_s, pw.gpus))
            for u in pw.gpus:
                self.placed[u] = (None, a)
            if c.ram_used:
                self.ram_peak_mib = max(self.ram_peak_mib, max(c.ram_used.values()))

    def _restore(self, g: Group, ep: str, start_s: float) -> None:
        """Commit the restore of set-point ``ep`` on ``g`` at ``start_s`` (never a victim)."""
        start_s = max(start_s, self.committed.group_free(g))
        a = self.committed.restore(g, ep, start_s)
        self._log_residency(a, ep)
        self.restores.append((a.start_s, a.end_s, g))
        for u in g:
            self.placed[u] = (None, a)

    def _log_residency(self, a: Assignment, endpoint: str) -> None:
        """A committed placement's residency changes: nothing ready from its start while it
        evicts and loads, ``endpoint`` from its service start (a restore: its end)."""
        if a.load == "warm":
            return
        for u in a.gpus:
            self.residency[u] += [(a.start_s, None), (a.service_start_s, endpoint)]


def _record(job: PlanJob, a: Any, base: FleetState) -> JobRecord:
    ev = max((base.endpoints[e].evict_s for e in a.evicts if e in base.endpoints), default=0.0)
    chosen = dict(getattr(a, "sleep_levels", ()))
    sleeps = tuple(e for e in a.evicts if e in base.endpoints and base.endpoints[e].wake_s is not None
                   and chosen.get(e, 1) > 0)
    levels = tuple(chosen.get(e) or _configured_level(base.endpoints[e]) for e in sleeps)
    return JobRecord(job.id, job.endpoint, job.priority, job.weight, job.release_s, a.start_s, a.service_start_s,
                     a.end_s, tuple(a.gpus), a.load, tuple(a.evicts), ev, sleeps=sleeps, sleep_levels=levels)


def _configured_level(endpoint: EndpointModel) -> int:
    """The level an endpoint the plan did not choose for sleeps at: its first sleep option's
    (the fleet file's ``sleep_level``); 1 for a model without options."""
    return endpoint.sleep_options[0][0] if endpoint.sleep_options else 1
