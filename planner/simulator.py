"""Discrete-event simulator: the planner in virtual time, no Redis.

Rolling horizon. At a planning point t the simulator
    1. admits every trace job submitted at or before t into the queue;
    2. plans the queue's first ``max_batch`` jobs (priority level, then submission) on
       the fleet as committed so far (GPUs busy until their committed work ends,
       residents and sleeping endpoints as that work leaves them), with the policy
       through :func:`makespan.planner.api.plan` — the same planner, evaluator and report as the
       live system;
    3. commits, in start order, the planned jobs that start before ``t + window_s``
       (they run as planned: service times are exact in simulation); the rest stay queued;
    4. preemption, one of two deciders (``preemption="plan"``, the default, or ``"rule"``;
       the live planner worker has the same two, ``MAKESPAN_PREEMPTION``):
       "plan" — for the policies with a floor (:attr:`makespan.planner.policies.Policy.floor`) the planning of
       step 2 itself decides preemptions by score (:mod:`makespan.planner.preemption_plan`; the
       committed jobs holding GPUs at t are passed as ``FleetState.running``); the plan's
       preemptions are applied at t as below (victims cut and requeued, the preemptor
       committed on the group at t) before its assignments are committed, and there is
       no second planning pass. "rule" (and "plan" for fifo, min-evict, wspt) — the
       fixed rule, :func:`makespan.planner.preemption.choose_preemption`: each CRITICAL/HIGH job of the
       batch left uncommitted that no free group can take, and whose earliest group does
       not free within its cold start, takes the cheapest group whose GPUs are free or
       held by running committed jobs of strictly lower levels (at least one held). The victims are cut at t and go back to
       the queue with their original submission time and sequence number; a victim
       restarts from zero (the live system re-runs a preempted job from the start);
       GPU-seconds it had used are reported as ``sim.preempted_gpu_s`` (not service,
       not transition). The preemptor is committed on the group at t, so a victim cannot
       be placed on those GPUs before it starts. After a preemption the queue is planned
       once more at t (the victims' other GPUs are free). Jobs committed but not yet
       started, restores, and jobs that other jobs depend on are never victims; nor is a
       job already preempted ``preemption_budget`` times, or one that has held its GPUs
       for less than ``preemption_min_runtime_s`` (:func:`makespan.planner.preemption.victim_allowed`);
    5. set-point restore (``restore=True``): the plan of step 2 holds a restore for every
       set-point instance not resident when its GPUs' planned work ends
       (``planned_restore``: one of :data:`makespan.planner.restore.RESTORE_AT`); step 3
       commits those that start before ``t + window_s`` like jobs, only when the batch
       holds every queued job (fewer than ``max_batch``, as the live worker; a restore is never
       preempted), unless the rule of step 4 then preempts (its victims were not in that
       plan; the pass after it places them and its restores). The live planner worker's rule stays as the fallback (and is the only
       one with ``planned_restore=None``): when the queue is empty and the committed work
       ends before the next arrival, every set-point instance not resident is restored at
       that time. Either is the transition rule of :mod:`makespan.planner.replay` (evict, then cold
       start or wake); its GPUs are busy until it ends; the report counts it
       (``transitions.restore``) and adds its GPU-seconds to transition time;
    6. moves to the next planning point: the next arrival or the earliest planned but
       uncommitted start, whichever is first, but not before ``t + window_s``.
The uncommitted rest of each plan goes to the next planning point as ``previous``
(:func:`makespan.planner.api.plan`): a solver policy starts from it when, repaired to the new
batch, it scores better than the greedy floor.
Committed work is never moved except by preemption. The future-cost term uses
``FleetState.demand``: for each endpoint with arrivals in the last ``demand_window_s``,
their mean weight (``demand``), and each endpoint's share of those arrivals' GPU-seconds
(``demand_share``, p_j·tp_j).
The run state and those steps are :class:`makespan.planner.simulator_run._Run`; this module
holds the driver (:func:`simulate`, :func:`run_simulation`), the report it assembles,
and the helpers the live planner worker shares (:func:`fleet_state`, :func:`recent_demand`,
:func:`recent_share`). Reading a fleet file and a trace (``makespan simulate``) is the
application's :func:`makespan.simulation.run_simulation`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from makespan.errors import ValidationError
from makespan.planner.fleet_input import FleetDescription, TraceRow
from makespan.planner.measures import build_report, eta_error, lower_bounds
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.policies import POLICY_REGISTRY, Policy
from makespan.planner.preemption import DEFAULT_MIN_RUNTIME_S, DEFAULT_PREEMPTION_BUDGET
from makespan.planner.fast_lane import DEFAULT_LANE_LEVELS, DEFAULT_START_GRACE, Grace, Levels, factors
from makespan.planner.reservation import DEFAULT_RESERVATION_AFTER_S
from makespan.planner.replay import Group
from makespan.planner.restore import set_point_absence, set_point_groups as restore_groups
from makespan.planner.simulator_run import _Run

# what ``preemption=True`` means (module doc, step 4): "rule" = the fixed rule for every
# policy; "plan" = scored inside the plan for the policies with a floor (makespan.planner.policies)
# (portfolio, default/cpsat, tardiness*), the fixed rule for fifo, min-evict and wspt
DEFAULT_PREEMPTION = "plan"


def fleet_state(fleet: FleetDescription, now_s: float = 0.0) -> FleetState:
    """The planner's view of a fleet file at its set point."""
    gpus = [Gpu(g.uuid, h.name, g.index, g.memory_mib) for h in fleet.hosts for g in sorted(h.gpus, key=lambda g: g.index)]
    eps = {n: EndpointModel(n, e.tensor_parallel, e.memory_mib_per_gpu, e.cold_start_s, e.evict_s, e.wake_s, e.slots,
                            e.asleep_gpu_mib, e.asleep_ram_mib, e.sleep_options)
           for n, e in fleet.endpoints.items()}
    sp = fleet.set_point_by_gpu()
    return FleetState(now_s, gpus, eps, resident=dict(sp), set_point=dict(sp), host_ram_mib=fleet.host_ram_budgets())


def to_plan_jobs(trace_jobs: Sequence[TraceRow], time_scale: float = 1.0) -> list[PlanJob]:
    """Trace jobs → planner jobs (weight from the priority level; times ÷ ``time_scale``)."""
    return [PlanJob(t.id, t.endpoint, float(t.priority.weight), t.submit_s / time_scale, t.service_s / time_scale,
                    int(t.priority), seq=i) for i, t in enumerate(trace_jobs)]


def simulate(trace_jobs: Sequence[TraceRow] | Sequence[PlanJob], fleet: FleetDescription | FleetState, policy: str | Policy,
             seed: int = 0, *, window_s: float = 30.0, max_batch: int = 256, demand_window_s: float = 1800.0,
              time_scale: float = 1.0, preemption: bool | str = True, restore: bool = True,
              planned_restore: str | None = "group", detail: bool = False, time_limit_s: float | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None,
             set_point_weight: float | None = None, preemption_budget: int = DEFAULT_PREEMPTION_BUDGET,
             preemption_min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
             reservation_after_s: float | None = DEFAULT_RESERVATION_AFTER_S,
             lane_levels: Levels = DEFAULT_LANE_LEVELS, lane_start_grace_s: Grace = DEFAULT_START_GRACE,
             prewarm: bool = False, lane_preempt: bool = True) -> dict[str, Any]:
    """Replay jobs through the planner in virtual time; returns the report dict
    (:func:`makespan.planner.measures.build_report`, with ``jobs.preempted`` and the set-point
    restores), ``set_point_absent_gpu_s`` (GPU-seconds from the first submission until the
    last job or restore ends during which a set-point instance was not resident,
    :func:`makespan.planner.restore.set_point_absence`) plus ``sim`` {wall_s, planning_points,
    window_s, max_batch, time_scale, seed, preemption, restore, planned_restore,
    time_limit_s, preempted_gpu_s, preemption_budget, preemption_min_runtime_s},
    ``eta_error_s`` {level: {n, p50, p90, mean}}: actual start − ETA at submit, s
    (:func:`makespan.planner.measures.eta_error`; a job's ETA is its planned start in a
    planning point's plan, the one a live job carries as ``wait_eta``; its ETA at submit is
    the one of the first plan that held it: the first planning point at or after its
    submission, unless the batch was full then) and, for
    jobs with ``deadline_s``,
    ``weighted_tardiness_s`` = Σ w_j·max(0, C_j − d_j) (weight·s), ``tardy_jobs`` and
    ``jobs_with_deadline``.

    ``policy``: a name in :data:`makespan.planner.policies.POLICY_REGISTRY` or a
    :class:`makespan.planner.policies.Policy` (a benchmark's variant); the report carries
    its name. Raises PlannerError on an unknown name.
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
    gpus}], resident_end: GPU -> endpoint when everything has ended, etas: job id ->
    [[planning point t_s, ETA s], …] at every planning point whose plan held it}.
    ``time_limit_s``: a solver policy's limit per planning point, wall s (None: the
    policy's default, 1 s for ``default``/``cpsat``/``tardiness``: a replay then takes
    about one second per planning point). ``progress``: called after each planning point
    with {planning_points, t_s, submitted, queued, completed, wall_s}.
    ``set_point_weight``: ``FleetState.set_point_weight`` of every planning point's state
    (score per GPU-s a set-point instance is absent in a plan; None: the given
    ``FleetState``'s, 0 for a fleet file); reported as ``sim.set_point_weight``.
    Raises PlannerError when negative or not finite. ``preemption_budget`` (times one job
    may be preempted; < 0: unbounded) and ``preemption_min_runtime_s`` (s a job holds its
    GPUs before it may be preempted): step 4's bounds, as ``Settings`` has them live.
    ``reservation_after_s``: the aging bound of step 2's plans (a job waiting this long
    gets a reservation with backfill, :mod:`makespan.planner.reservation`; None: none), reported
    with ``sim.reserved_points`` (planning points whose plan held one). ``lane_levels``:
    the fast lane's priority levels, or level -> wait factor (:mod:`makespan.planner.fast_lane`,
    default :data:`makespan.planner.fast_lane.DEFAULT_LANE_LEVELS`; (): none), reported with ``sim.lane_points`` (planning points whose plan it rebuilt).
    ``prewarm``: after each planning point (and when the queue is empty), wake sleepers on
    idle groups ahead of forecast demand (:mod:`makespan.planner.prewarm`, as the live
    ``Settings.prewarm``); counted in ``transitions.prewarm``, their GPU-seconds in
    ``transition_gpu_s``; reported as ``sim.prewarm``.
    ``lane_start_grace_s``: the lane levels bounded on start, level -> grace s (default
    :data:`makespan.planner.fast_lane.DEFAULT_START_GRACE`, as ``Settings.fast_lane_start``;
    {}: every lane level bounded on completion), reported as ``sim.lane_start_grace_s``
    when not empty. ``lane_preempt``: with ``preemption="plan"``, a start-bounded lane job takes
    the preemption strict priority's rule would give it (``plan(lane_preempt=)``; default True,
    as the live planner; False reported as ``sim.lane_preempt``).
    """
    wall0 = time.perf_counter()
    chosen = POLICY_REGISTRY.lookup(policy)
    base = fleet if isinstance(fleet, FleetState) else fleet_state(fleet)
    if set_point_weight is not None:
        base = replace(base, set_point_weight=set_point_weight)  # validated there
    jobs = list(trace_jobs) if trace_jobs and isinstance(trace_jobs[0], PlanJob) else \
        to_plan_jobs(trace_jobs, time_scale)  # type: ignore[arg-type]
    jobs.sort(key=lambda j: (j.release_s, j.seq))
    sp = set_point_groups(base if isinstance(fleet, FleetState) else fleet)
    mode = preemption_mode(preemption)
    run = _Run(base, chosen, window_s, max_batch, jobs, sp if restore else [], mode, time_limit_s,
               preemption_budget, preemption_min_runtime_s, reservation_after_s, factors(lane_levels), dict(lane_start_grace_s))
    run.restore_at = planned_restore if restore else None
    run.prewarm = prewarm
    run.lane_preempt = lane_preempt
    recent: deque[PlanJob] = deque()
    i, n, t = 0, len(jobs), (jobs[0].release_s if jobs else 0.0)
    while i < n or run.queue:
        while i < n and jobs[i].release_s <= t:
            run.queue[jobs[i].id] = jobs[i]
            recent.append(jobs[i])
            i += 1
        while recent and recent[0].release_s < t - demand_window_s:
            recent.popleft()
        nxt_planned = run.plan_point(t, recent_demand(recent), recent_share(recent, base)) if run.queue else float("inf")
        if progress is not None:
            progress({"planning_points": len(run.solve), "t_s": t, "submitted": i, "queued": len(run.queue),
                      "completed": len(run.records), "wall_s": time.perf_counter() - wall0})
        nxt_arrival = jobs[i].release_s if i < n else float("inf")
        if not run.queue:
            run.restore_if_idle(t, nxt_arrival)
        nxt = min(nxt_arrival, nxt_planned)
        if nxt == float("inf") and run.queue:
            nxt = t + window_s
        t_next = max(t + window_s, nxt) if run.queue else max(t, nxt)
        if prewarm and t_next > t:
            run.prewarm_point(t, recent_share(recent, base), t_next)
        t = t_next
    gpu_ids = [g.uuid for g in base.gpus]
    eligible = {e: {u for g in base.groups(ep.tp, ep.memory_mib) for u in g} for e, ep in base.endpoints.items()}
    lb = lower_bounds(jobs, base.endpoints, len(gpu_ids),
                      resident={e for e in base.resident.values() if e is not None})
    rep = build_report(list(run.records.values()), policy=chosen.name, gpus=len(gpu_ids), submitted=n,
                       preempted=run.preempted, restores=run.restores + run.prewarms, solve_times_s=run.solve,
                       lower_bound_makespan_s=lb["makespan_s"], lower_bound_weighted_s=lb["weighted_completion_s"],
                       gpu_ids=gpu_ids, eligible=eligible)
    rep["transitions"]["restore"] = len(run.restores)  # the prewarms were passed beside them for their GPU-s
    rep["transitions"]["prewarm"] = len(run.prewarms)
    end_s = max([*(r.end_s for r in run.records.values()), *(b for _, b, _ in run.restores)], default=0.0)
    rep["set_point_absent_gpu_s"] = set_point_absence(run.residency, sp, base.resident,
                                                      jobs[0].release_s if jobs else 0.0, end_s)
    rep["eta_error_s"] = eta_error(list(run.records.values()), {k: h[0][1] for k, h in run.etas.items() if h})
    due = {j.id: j.deadline_s for j in jobs if j.deadline_s is not None}
    late = [r.weight * (r.end_s - due[r.id]) for r in run.records.values() if r.id in due and r.end_s > due[r.id]]
    rep["weighted_tardiness_s"], rep["tardy_jobs"], rep["jobs_with_deadline"] = sum(late), len(late), len(due)
    rep["sim"] = {"wall_s": time.perf_counter() - wall0, "planning_points": len(run.solve), "window_s": window_s,
                  "max_batch": max_batch, "time_scale": time_scale, "seed": seed, "preemption": bool(mode),
                  "preemption_mode": mode or "off",
                  "restore": restore, "planned_restore": planned_restore if restore else None,
                  # the limit that applied: the policy's own default when none was given (None: a greedy policy)
                  "time_limit_s": time_limit_s if time_limit_s is not None else chosen.time_limit_s,
                  "set_point_weight": base.set_point_weight, "preempted_gpu_s": sum((b - a) * len(g) for a, b, g in run.lost),
                  "preemption_budget": preemption_budget, "preemption_min_runtime_s": preemption_min_runtime_s,
                  "reservation_after_s": reservation_after_s, "reserved_points": run.reserved_points,
                  "lane_levels": {str(k): v for k, v in run.lane_levels.items()}, "lane_points": run.lane_points,
                  "prewarm": prewarm,
                  **({} if lane_preempt else {"lane_preempt": False}),
                  **({"lane_start_grace_s": {str(k): v for k, v in lane_start_grace_s.items()}} if lane_start_grace_s else {})}
    if base.host_ram_mib:  # fleets with a RAM budget for sleepers (issue 20): its peak against the budget
        rep["host_ram"] = {"peak_mib": run.ram_peak_mib, "budget_mib": dict(base.host_ram_mib)}
    if detail:
        rep["schedule"] = {"jobs": [asdict(r) for r in run.records.values()], "restores": run.restores,
                           "lost": run.lost, "preemptions": run.log, "resident_end": dict(run.committed.resident),
                           "etas": {k: [list(x) for x in h] for k, h in run.etas.items()}}
    return rep


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


def set_point_groups(fleet: FleetDescription | FleetState) -> list[tuple[str, Group]]:
    """(endpoint, GPU uuids) of every set-point instance: the fleet file's instances, or
    for a bare :class:`FleetState` its aligned groups whose every GPU's set point is the
    endpoint (:func:`makespan.planner.restore.set_point_groups`)."""
    if not isinstance(fleet, FleetState):
        hosts = {h.name: h for h in fleet.hosts}
        out = []
        for e in fleet.endpoints.values():
            for sp in e.set_point:
                by_index = {g.index: g.uuid for g in hosts[sp.host].gpus}
                out.append((e.name, tuple(by_index[i] for i in sp.gpus)))
        return out
    return restore_groups(fleet)


def recent_demand(recent: Iterable[PlanJob]) -> dict[str, float]:
    """``FleetState.demand``: endpoint -> mean weight of the ``recent`` arrivals for it."""
    tot: dict[str, list[float]] = {}
    for j in recent:
        s = tot.setdefault(j.endpoint, [0.0, 0.0])
        s[0] += j.weight
        s[1] += 1
    return {e: w / c for e, (w, c) in tot.items()}


def recent_share(recent: Iterable[PlanJob], base: FleetState) -> dict[str, float]:
    """``FleetState.demand_share``: endpoint -> its share (0–1) of the ``recent`` arrivals'
    GPU-seconds (service s × tensor-parallel GPUs of ``base``'s endpoint); {} when none."""
    work: dict[str, float] = {}
    for j in recent:
        work[j.endpoint] = work.get(j.endpoint, 0.0) + j.service_s * base.endpoints[j.endpoint].tp
    tot = sum(work.values())
    return {e: v / tot for e, v in work.items()} if tot > 0 else {}


# the names before they were public (workers.fleet_view imported these); new code uses the public ones
_demand, _share = recent_demand, recent_share


def writable_report_path(report_path: str | Path) -> Path:
    """``report_path`` with its folder created, checked before a run (``simulate``,
    ``demo``, ``replay``) so that a bad path fails at once, not after the run.

    Raises:
        ValidationError: a folder, or a path that cannot be written (``--report: ...``).
    """
    p = Path(report_path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise ValidationError("--report", str(p), "is a folder; give a file path such as runs/report.json")
        # checked, not created: a run interrupted before its end must not leave an empty (or, an
        # earlier run's, a stale-looking) report behind (a capacity planner's SIGINT left 0 bytes)
        target = p if p.exists() else p.parent
        if not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
    except OSError as e:
        raise ValidationError("--report", str(p), f"cannot be written: {e.strerror or e}") from e
    return p


def write_report(report_path: str | Path, report: dict[str, Any]) -> None:
    """Write ``report`` as JSON to ``report_path`` whole or not at all: into a temporary
    file beside it, then renamed over it (a reader never sees half a report, and an
    interrupted write leaves the earlier file as it was).

    Raises:
        OSError: the folder cannot be written."""
    p = Path(report_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=2)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
