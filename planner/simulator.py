"""Discrete-event simulator: the planner in virtual time, no Redis.

Rolling horizon. At a planning point t the simulator
    1. admits every trace job submitted at or before t into the queue;
    2. plans the queue's first ``max_batch`` jobs (priority level, then submission) on
       the fleet as committed so far (GPUs busy until their committed work ends,
       residents and sleeping endpoints as that work leaves them), with the policy
       through :func:`planner.api.plan` — the same planner, evaluator and report as the
       live system;
    3. commits, in start order, the planned jobs that start before ``t + window_s``
       (they run as planned: service times are exact in simulation); the rest stay queued;
    4. preemption, one of two deciders (``preemption="plan"``, the default, or ``"rule"``;
       the live planner worker has the same two, ``MAKESPAN_PREEMPTION``):
       "plan" — for the policies of :data:`planner.api.PREEMPTION_FLOOR` the planning of
       step 2 itself decides preemptions by score (:mod:`planner.preemption_plan`; the
       committed jobs holding GPUs at t are passed as ``FleetState.running``); the plan's
       preemptions are applied at t as below (victims cut and requeued, the preemptor
       committed on the group at t) before its assignments are committed, and there is
       no second planning pass. "rule" (and "plan" for fifo, min-evict, wspt) — the
       fixed rule, :func:`planner.preemption.choose_preemption`: each CRITICAL/HIGH job of the
       batch left uncommitted that no free group can take, and whose earliest group does
       not free within its cold start, takes the cheapest group held only by running
       committed jobs of strictly lower levels. The victims are cut at t and go back to
       the queue with their original submission time and sequence number; a victim
       restarts from zero (the live system re-runs a preempted job from the start);
       GPU-seconds it had used are reported as ``sim.preempted_gpu_s`` (not service,
       not transition). The preemptor is committed on the group at t, so a victim cannot
       be placed on those GPUs before it starts. After a preemption the queue is planned
       once more at t (the victims' other GPUs are free). Jobs committed but not yet
       started, restores, and jobs that other jobs depend on are never victims;
    5. set-point restore (``restore=True``): the plan of step 2 holds a restore for every
       set-point instance not resident when its GPUs' planned work ends
       (``planned_restore``: one of :data:`planner.restore.RESTORE_AT`); step 3
       commits those that start before ``t + window_s`` like jobs, only when the batch
       holds every queued job (fewer than ``max_batch``, as the live worker; a restore is never
       preempted), unless the rule of step 4 then preempts (its victims were not in that
       plan; the pass after it places them and its restores). The live planner worker's rule stays as the fallback (and is the only
       one with ``planned_restore=None``): when the queue is empty and the committed work
       ends before the next arrival, every set-point instance not resident is restored at
       that time. Either is the transition rule of :mod:`planner.replay` (evict, then cold
       start or wake); its GPUs are busy until it ends; the report counts it
       (``transitions.restore``) and adds its GPU-seconds to transition time;
    6. moves to the next planning point: the next arrival or the earliest planned but
       uncommitted start, whichever is first, but not before ``t + window_s``.
The uncommitted rest of each plan goes to the next planning point as ``previous``
(:func:`planner.api.plan`): a solver policy starts from it when, repaired to the new
batch, it scores better than the greedy floor.
Committed work is never moved except by preemption. The future-cost term uses
``FleetState.demand``: for each endpoint with arrivals in the last ``demand_window_s``,
their mean weight (``demand``), and each endpoint's share of those arrivals' GPU-seconds
(``demand_share``, p_j·tp_j).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from app.errors import PlannerError, ValidationError
from app.models import FleetSpec, load_fleet
from app.traces import TraceJob, read_trace
from planner.api import POLICIES, PREEMPTION_FLOOR, plan
from planner.measures import JobRecord, build_report, lower_bounds
from planner.model import Assignment, EndpointModel, FleetState, Gpu, Plan, PlanJob, PlannedPreemption, RunningJob
from planner.preemption import Holder, choose_preemption
from planner.replay import Group, Replay
from planner.restore import set_point_absence, set_point_groups as restore_groups

# what ``preemption=True`` means (module doc, step 4): "rule" = the fixed rule for every
# policy; "plan" = scored inside the plan for the policies of planner.api.PREEMPTION_FLOOR
# (portfolio, default/cpsat, tardiness*), the fixed rule for fifo, min-evict and wspt
DEFAULT_PREEMPTION = "plan"


def fleet_state(fleet: FleetSpec, now_s: float = 0.0) -> FleetState:
    """The planner's view of a fleet file at its set point."""
    gpus = [Gpu(g.uuid, h.name, g.index, g.memory_mib) for h in fleet.hosts for g in sorted(h.gpus, key=lambda g: g.index)]
    eps = {n: EndpointModel(n, e.tensor_parallel, e.memory_mib_per_gpu, e.cold_start_s, e.evict_s, e.wake_s, e.slots)
           for n, e in fleet.endpoints.items()}
    sp = fleet.set_point_by_gpu()
    return FleetState(now_s, gpus, eps, resident=dict(sp), set_point=dict(sp))


def to_plan_jobs(trace_jobs: Sequence[TraceJob], time_scale: float = 1.0) -> list[PlanJob]:
    """Trace jobs → planner jobs (weight from the priority level; times ÷ ``time_scale``)."""
    return [PlanJob(t.id, t.endpoint, float(t.priority.weight), t.submit_s / time_scale, t.service_s / time_scale,
                    int(t.priority), seq=i) for i, t in enumerate(trace_jobs)]


def simulate(trace_jobs: Sequence[TraceJob] | Sequence[PlanJob], fleet: FleetSpec | FleetState, policy: str,
             seed: int = 0, *, window_s: float = 30.0, max_batch: int = 256, demand_window_s: float = 1800.0,
              time_scale: float = 1.0, preemption: bool | str = True, restore: bool = True,
              planned_restore: str | None = "group", detail: bool = False, time_limit_s: float | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None,
             set_point_weight: float | None = None) -> dict[str, Any]:
    """Replay jobs through the planner in virtual time; returns the report dict
    (:func:`planner.measures.build_report`, with ``jobs.preempted`` and the set-point
    restores), ``set_point_absent_gpu_s`` (GPU-seconds from the first submission until the
    last job or restore ends during which a set-point instance was not resident,
    :func:`planner.restore.set_point_absence`) plus ``sim`` {wall_s, planning_points,
    window_s, max_batch, time_scale, seed, preemption, restore, planned_restore,
    time_limit_s, preempted_gpu_s} and, for jobs with ``deadline_s``,
    ``weighted_tardiness_s`` = Σ w_j·max(0, C_j − d_j) (weight·s), ``tardy_jobs`` and
    ``jobs_with_deadline``.

    ``seed`` is recorded (the trace mapping already used it; the planner is deterministic).
    ``preemption``: False (off), ``"rule"``, ``"plan"`` or True (= :data:`DEFAULT_PREEMPTION`,
    ``"plan"``), the module's step 4; ``sim.preemption`` is whether it is on and
    ``sim.preemption_mode`` which ("off", "rule", "plan"); preemption records of a scored
    decision carry its ``gain`` (weight·s). ``restore`` (on by default, as in the live
    planner worker) switches set-point restore (``restore=False``: no restores at all);
    ``planned_restore`` places restores in the plans (step 5; None: only the idle rule, as
    before plans held restores). ``detail`` adds
    ``schedule`` {jobs: the final job records, restores: (start_s, end_s, gpus),
    lost: preempted attempts (start_s, cut_s, gpus), preemptions: [{t_s, job, victims,
    gpus}], resident_end: GPU -> endpoint when everything has ended}.
    ``time_limit_s``: a solver policy's limit per planning point, wall s (None: the
    policy's default, 1 s for ``default``/``cpsat``/``tardiness``: a replay then takes
    about one second per planning point). ``progress``: called after each planning point
    with {planning_points, t_s, submitted, queued, completed, wall_s}.
    ``set_point_weight``: ``FleetState.set_point_weight`` of every planning point's state
    (score per GPU-s a set-point instance is absent in a plan; None: the given
    ``FleetState``'s, 0 for a fleet file); reported as ``sim.set_point_weight``.
    Raises PlannerError when negative or not finite.
    """
    wall0 = time.perf_counter()
    base = fleet if isinstance(fleet, FleetState) else fleet_state(fleet)
    if set_point_weight is not None:
        base = replace(base, set_point_weight=set_point_weight)  # validated there
    jobs = list(trace_jobs) if trace_jobs and isinstance(trace_jobs[0], PlanJob) else \
        to_plan_jobs(trace_jobs, time_scale)  # type: ignore[arg-type]
    jobs.sort(key=lambda j: (j.release_s, j.seq))
    sp = set_point_groups(fleet if isinstance(fleet, FleetSpec) else base)
    mode = preemption_mode(preemption)
    run = _Run(base, policy, window_s, max_batch, jobs, sp if restore else [], mode, time_limit_s)
    run.restore_at = planned_restore if restore else None
    recent: deque[PlanJob] = deque()
    i, n, t = 0, len(jobs), (jobs[0].release_s if jobs else 0.0)
    while i < n or run.queue:
        while i < n and jobs[i].release_s <= t:
            run.queue[jobs[i].id] = jobs[i]
            recent.append(jobs[i])
            i += 1
        while recent and recent[0].release_s < t - demand_window_s:
            recent.popleft()
        nxt_planned = run.plan_point(t, _demand(recent), _share(recent, base)) if run.queue else float("inf")
        if progress is not None:
            progress({"planning_points": len(run.solve), "t_s": t, "submitted": i, "queued": len(run.queue),
                      "completed": len(run.records), "wall_s": time.perf_counter() - wall0})
        nxt_arrival = jobs[i].release_s if i < n else float("inf")
        if not run.queue:
            run.restore_if_idle(t, nxt_arrival)
        nxt = min(nxt_arrival, nxt_planned)
        if nxt == float("inf") and run.queue:
            nxt = t + window_s
        t = max(t + window_s, nxt) if run.queue else max(t, nxt)
    gpu_ids = [g.uuid for g in base.gpus]
    eligible = {e: {u for g in base.groups(ep.tp, ep.memory_mib) for u in g} for e, ep in base.endpoints.items()}
    lb = lower_bounds(jobs, base.endpoints, len(gpu_ids),
                      resident={e for e in base.resident.values() if e is not None})
    rep = build_report(list(run.records.values()), policy=policy, gpus=len(gpu_ids), submitted=n,
                       preempted=run.preempted, restores=run.restores, solve_times_s=run.solve,
                       lower_bound_makespan_s=lb["makespan_s"], lower_bound_weighted_s=lb["weighted_completion_s"],
                       gpu_ids=gpu_ids, eligible=eligible)
    end_s = max([*(r.end_s for r in run.records.values()), *(b for _, b, _ in run.restores)], default=0.0)
    rep["set_point_absent_gpu_s"] = set_point_absence(run.residency, sp, base.resident,
                                                      jobs[0].release_s if jobs else 0.0, end_s)
    due = {j.id: j.deadline_s for j in jobs if j.deadline_s is not None}
    late = [r.weight * (r.end_s - due[r.id]) for r in run.records.values() if r.id in due and r.end_s > due[r.id]]
    rep["weighted_tardiness_s"], rep["tardy_jobs"], rep["jobs_with_deadline"] = sum(late), len(late), len(due)
    rep["sim"] = {"wall_s": time.perf_counter() - wall0, "planning_points": len(run.solve), "window_s": window_s,
                  "max_batch": max_batch, "time_scale": time_scale, "seed": seed, "preemption": bool(mode),
                  "preemption_mode": mode or "off",
                  "restore": restore, "planned_restore": planned_restore if restore else None,
                  "time_limit_s": time_limit_s, "set_point_weight": base.set_point_weight, "preempted_gpu_s": sum((b - a) * len(g) for a, b, g in run.lost)}
    if detail:
        rep["schedule"] = {"jobs": [asdict(r) for r in run.records.values()], "restores": run.restores,
                           "lost": run.lost, "preemptions": run.log, "resident_end": dict(run.committed.resident)}
    return rep


class _Run:
    """The committed schedule of one simulation and the steps that change it."""

    def __init__(self, base: FleetState, policy: str, window_s: float, max_batch: int, jobs: list[PlanJob],
                 set_points: list[tuple[str, Group]], preemption: str, time_limit_s: float | None = None):
        self.base, self.policy, self.window_s, self.max_batch = base, policy, window_s, max_batch
        self.time_limit_s = time_limit_s
        self.set_points, self.preemption = set_points, preemption
        self.committed = Replay(base)
        self.previous: Plan | None = None  # the last planning point's uncommitted plan
        self.queue: dict[str, PlanJob] = {}
        self.records: dict[str, JobRecord] = {}
        self.solve: list[float] = []
        self.placed: dict[str, tuple[PlanJob | None, Assignment]] = {}  # GPU -> its last placement
        self.restores: list[tuple[float, float, Group]] = []
        self.lost: list[tuple[float, float, Group]] = []  # preempted attempts (start, cut, GPUs)
        self.preempted = 0
        self.log: list[dict[str, Any]] = []
        self.dependants = {d for j in jobs for d in j.deps}
        self.restore_at: str | None = None  # planned restores (planner.restore.RESTORE_AT), None: idle rule only
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
                               set_point_weight=self.base.set_point_weight)
            scored = self.preemption == "plan" and self.policy in PREEMPTION_FLOOR
            if scored:
                state.running = self._running(t)
            c0 = time.perf_counter()
            p = plan(batch, state, self.policy, previous=self.previous, time_limit_s=self.time_limit_s,
                     preemption=scored, restore_at=self.restore_at)
            self.solve.append(time.perf_counter() - c0)
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
        return victim

    def _apply(self, t: float, pp: PlannedPreemption, job: PlanJob) -> dict[str, PlanJob]:
        """A plan's preemption at ``t``, as :meth:`_preempt` does it: cut the victims,
        commit the preemptor on the group at ``t``. Returns the victims by id."""
        out = {v: self._cut(t, v) for v in pp.victims}
        self._place(job, tuple(pp.gpus), t)
        self.log.append({"t_s": t, "job": job.id, "victims": list(pp.victims), "gpus": list(pp.gpus),
                         "gain": pp.gain})
        return out

    def _place(self, job: PlanJob, gpus: Group, start_s: float) -> Assignment:
        a = self.committed.place(job, gpus, start_s)
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
        return Holder(job.id, job.priority, a.start_s <= t and job.id not in self.dependants and last)

    def _preempt(self, t: float, waiting: list[PlanJob]) -> bool:
        """The preemption step at ``t`` (:func:`planner.preemption.choose_preemption`);
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


def preemption_mode(preemption: bool | str | None) -> str:
    """``simulate``'s ``preemption`` as a mode: "" (off: False/None/"off"), "rule" or
    "plan" (True: :data:`DEFAULT_PREEMPTION`). Raises ValidationError otherwise."""
    if preemption is None or preemption is False or preemption == "off":
        return ""
    if preemption is True:
        return DEFAULT_PREEMPTION
    if preemption in ("rule", "plan"):
        return str(preemption)
    raise ValidationError("preemption", preemption, "must be True, False, 'rule', 'plan' or 'off'")


def set_point_groups(fleet: FleetSpec | FleetState) -> list[tuple[str, Group]]:
    """(endpoint, GPU uuids) of every set-point instance: the fleet file's instances, or
    for a bare :class:`FleetState` its aligned groups whose every GPU's set point is the
    endpoint (:func:`planner.restore.set_point_groups`)."""
    if isinstance(fleet, FleetSpec):
        hosts = {h.name: h for h in fleet.hosts}
        out = []
        for e in fleet.endpoints.values():
            for sp in e.set_point:
                by_index = {g.index: g.uuid for g in hosts[sp.host].gpus}
                out.append((e.name, tuple(by_index[i] for i in sp.gpus)))
        return out
    return restore_groups(fleet)


def _demand(recent: deque[PlanJob]) -> dict[str, float]:
    tot: dict[str, list[float]] = {}
    for j in recent:
        s = tot.setdefault(j.endpoint, [0.0, 0.0])
        s[0] += j.weight
        s[1] += 1
    return {e: w / c for e, (w, c) in tot.items()}


def _share(recent: deque[PlanJob], base: FleetState) -> dict[str, float]:
    work: dict[str, float] = {}
    for j in recent:
        work[j.endpoint] = work.get(j.endpoint, 0.0) + j.service_s * base.endpoints[j.endpoint].tp
    tot = sum(work.values())
    return {e: v / tot for e, v in work.items()} if tot > 0 else {}


def _record(job: PlanJob, a: Any, base: FleetState) -> JobRecord:
    ev = max((base.endpoints[e].evict_s for e in a.evicts if e in base.endpoints), default=0.0)
    return JobRecord(job.id, job.endpoint, job.priority, job.weight, job.release_s, a.start_s, a.service_start_s,
                     a.end_s, tuple(a.gpus), a.load, tuple(a.evicts), ev)


def run_simulation(trace_path: str | Path, fleet_path: str | Path, policy: str, seed: int = 0, start: int = 0,
                   limit: int | None = None, report_path: str | Path | None = None,
                   time_scale: float = 1.0, window_s: float = 30.0, preemption: bool | str = True,
                   restore: bool = True, time_limit_s: float | None = None,
                   progress: Callable[[dict[str, Any]], None] | None = None,
                   set_point_weight: float = 0.0) -> dict[str, Any]:
    """``makespan simulate``: read the fleet (TOML) and the trace (ITP, Alibaba or JSON
    lines; rows ``start`` … ``start+limit`` mapped with ``seed``), simulate, and write
    the report JSON to ``report_path`` when given (checked writable before the run, so a
    long run is not lost to a bad path). ``time_scale`` divides submission and service
    times; ``preemption``/``restore``/``time_limit_s``/``progress``/``set_point_weight``: as
    :func:`simulate`.
    Returns the report.

    Raises:
        app.errors.ValidationError: bad fleet or trace file, no rows in the asked range,
            ``time_scale`` or ``time_limit_s`` not positive, ``set_point_weight`` negative
            or not finite, or a report path that cannot be written.
        app.errors.PlannerError: unknown policy.
    """
    if not time_scale > 0:
        raise ValidationError("time_scale", time_scale, "must be > 0")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValidationError("time_limit_s", time_limit_s, "must be > 0")
    if not 0 <= set_point_weight < float("inf"):
        raise ValidationError("set_point_weight", set_point_weight, "must be a finite number >= 0")
    if policy not in POLICIES:
        raise PlannerError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}")
    fleet = load_fleet(fleet_path)
    jobs = read_trace(trace_path, fleet, seed=seed, start=start, limit=limit)
    if not jobs:
        raise ValidationError("trace", str(trace_path), f"no rows from row {start} on (the trace is shorter)")
    out = _writable(report_path) if report_path is not None else None
    rep = simulate(jobs, fleet, policy, seed, time_scale=time_scale, window_s=window_s, preemption=preemption,
                   restore=restore, time_limit_s=time_limit_s, progress=progress, set_point_weight=set_point_weight)
    if out is not None:
        out.write_text(json.dumps(rep, indent=2))
    return rep


def _writable(report_path: str | Path) -> Path:
    """``report_path`` with its folder created; ValidationError when it cannot be written."""
    p = Path(report_path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise ValidationError("report", str(p), "is a folder; give a file path such as runs/report.json")
        with p.open("a"):
            pass
    except OSError as e:
        raise ValidationError("report", str(p), f"cannot be written: {e.strerror or e}") from e
    return p
