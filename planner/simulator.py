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
    4. moves to the next planning point: the next arrival or the earliest planned but
       uncommitted start, whichever is first, but not before ``t + window_s``.
Committed work is never moved (plan stability). The future-cost term uses
``FleetState.demand``: for each endpoint with arrivals in the last ``demand_window_s``,
their mean weight (``demand``), and each endpoint's share of those arrivals' GPU-seconds
(``demand_share``, p_j·tp_j).

Set-point restore is not simulated (the fleet keeps what the last job loaded), and no
preemption happens (a committed job runs to completion).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.models import FleetSpec, load_fleet
from app.traces import TraceJob, read_trace
from planner.api import plan
from planner.measures import JobRecord, build_report, lower_bounds
from planner.model import EndpointModel, FleetState, Gpu, PlanJob
from planner.replay import Replay


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
             time_scale: float = 1.0) -> dict[str, Any]:
    """Replay jobs through the planner in virtual time; returns the report dict
    (:func:`planner.measures.build_report`) plus ``sim`` {wall_s, planning_points,
    window_s, max_batch, time_scale, seed}.

    ``seed`` is recorded (the trace mapping already used it; the planner is deterministic).
    """
    wall0 = time.perf_counter()
    base = fleet if isinstance(fleet, FleetState) else fleet_state(fleet)
    jobs = list(trace_jobs) if trace_jobs and isinstance(trace_jobs[0], PlanJob) else \
        to_plan_jobs(trace_jobs, time_scale)  # type: ignore[arg-type]
    jobs.sort(key=lambda j: (j.release_s, j.seq))
    committed = Replay(base)
    queue: dict[str, PlanJob] = {}
    recent: deque[PlanJob] = deque()
    records: list[JobRecord] = []
    solve: list[float] = []
    i, n, t = 0, len(jobs), (jobs[0].release_s if jobs else 0.0)
    while i < n or queue:
        while i < n and jobs[i].release_s <= t:
            queue[jobs[i].id] = jobs[i]
            recent.append(jobs[i])
            i += 1
        while recent and recent[0].release_s < t - demand_window_s:
            recent.popleft()
        nxt_planned = float("inf")
        if queue:
            batch = sorted(queue.values(), key=lambda j: (j.priority, j.seq))[:max_batch]
            state = FleetState(t, base.gpus, base.endpoints, free_at=dict(committed.free_at),
                               resident=dict(committed.resident), set_point=base.set_point,
                               end_of=committed.end_of, asleep=dict(committed.asleep),
                               demand=_demand(recent), demand_share=_share(recent, base))
            c0 = time.perf_counter()
            p = plan(batch, state, policy)
            solve.append(time.perf_counter() - c0)
            bj = {j.id: j for j in batch}
            for a in sorted(p.assignments, key=lambda a: a.start_s):
                if a.start_s < t + window_s:
                    job = bj[a.job_id]
                    b = committed.place(job, a.gpus, max(a.start_s, t))
                    records.append(_record(job, b, base))
                    del queue[a.job_id]
                else:
                    nxt_planned = min(nxt_planned, a.start_s)
        nxt_arrival = jobs[i].release_s if i < n else float("inf")
        nxt = min(nxt_arrival, nxt_planned)
        if nxt == float("inf") and queue:
            nxt = t + window_s
        t = max(t + window_s, nxt) if queue else max(t, nxt)
    gpu_ids = [g.uuid for g in base.gpus]
    eligible = {e: {u for g in base.groups(ep.tp, ep.memory_mib) for u in g} for e, ep in base.endpoints.items()}
    lb = lower_bounds(jobs, base.endpoints, len(gpu_ids),
                      resident={e for e in base.resident.values() if e is not None})
    rep = build_report(records, policy=policy, gpus=len(gpu_ids), submitted=n, solve_times_s=solve,
                       lower_bound_makespan_s=lb["makespan_s"], lower_bound_weighted_s=lb["weighted_completion_s"],
                       gpu_ids=gpu_ids, eligible=eligible)
    rep["sim"] = {"wall_s": time.perf_counter() - wall0, "planning_points": len(solve), "window_s": window_s,
                  "max_batch": max_batch, "time_scale": time_scale, "seed": seed}
    return rep


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
                   time_scale: float = 1.0, window_s: float = 30.0) -> dict[str, Any]:
    """``makespan simulate``: read the fleet (TOML) and the trace (ITP, Alibaba or JSON
    lines; rows ``start`` … ``start+limit`` mapped with ``seed``), simulate, and write
    the report JSON to ``report_path`` when given. Returns the report.

    Raises:
        app.errors.ValidationError: bad fleet or trace file.
        app.errors.PlannerError: unknown policy.
    """
    fleet = load_fleet(fleet_path)
    jobs = read_trace(trace_path, fleet, seed=seed, start=start, limit=limit)
    rep = simulate(jobs, fleet, policy, seed, time_scale=time_scale, window_s=window_s)
    if report_path is not None:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(rep, indent=2))
    return rep
