"""Measures and the report JSON object shared by ``demo``, ``replay`` and ``simulate``.

Definitions follow the design notes ("Measures"); times are workload seconds.

* weighted completion: Σ_j w_j (C_j − r_j) over completed jobs, s.
* makespan: last completion − first submission, s (over every record, failed included).
* utilization: GPU-seconds in service (``end_s − service_start_s``) / (GPUs × makespan).
* transition GPU-seconds: Σ tp·(service_start − start) plus restore GPU-seconds.
* idle GPU-seconds: GPUs × makespan − service − transition GPU-seconds (≥ 0).
* idle-while-queued: GPU-seconds a GPU was neither serving nor in a transition while a
  job it could have served (its endpoint fits that GPU's host group) had been submitted
  and not started; computed per GPU by an interval sweep.
* wait p50/p95 per priority level: ``start_s − submit_s`` (linear-interpolation
  percentiles; ``None`` where a level had no job).
* ETA error per priority level (:func:`eta_error`, the simulator): actual start − the ETA
  the job got at submit (its planned start in the first plan that held it), s; > 0: it
  started later than first told. p50/p90 and the signed mean.

Lower bounds (:func:`lower_bounds`) are proved in their docstrings.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from makespan.planner.model import EndpointModel, PlanJob

LEVELS = ("CRITICAL", "HIGH", "NORMAL", "LOW")

Interval = tuple[float, float]
Restore = tuple[str, ...] | tuple[float, float, tuple[str, ...]]


@dataclass(frozen=True)
class JobRecord:
    """One finished (or failed) job; times in workload seconds.

    ``start_s`` is when its GPUs were taken (transitions begin); ``service_start_s``
    when the endpoint was ready; ``end_s`` = C_j. ``evict_s`` is the part of the
    transition spent evicting. ``load`` is ``"warm"``, ``"cold_start"`` or ``"wake"``.
    ``evicts``: the endpoints its transition displaced (stopped or put to sleep);
    ``sleeps``: those of them put to sleep (sleep mode); ``sleep_levels``: the sleep
    level (1 or 2) of each of ``sleeps``, in the same order (empty: not recorded)."""

    id: str
    endpoint: str
    priority: int
    weight: float
    submit_s: float
    start_s: float
    service_start_s: float
    end_s: float
    gpus: tuple[str, ...]
    load: str = "warm"
    evicts: tuple[str, ...] = ()
    evict_s: float = 0.0
    status: str = "completed"
    sleeps: tuple[str, ...] = ()
    sleep_levels: tuple[int, ...] = ()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), ``q`` in [0, 100]; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of closed intervals (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def minus_length(covered: list[Interval], removed: list[Interval]) -> float:
    """Length of ``covered \\ removed``; both sorted and disjoint (as :func:`union` gives)."""
    total = 0.0
    j = 0
    for a, b in covered:
        cur = a
        while j < len(removed) and removed[j][1] <= cur:
            j += 1
        k = j
        while cur < b and k < len(removed) and removed[k][0] < b:
            ra, rb = removed[k]
            if ra > cur:
                total += ra - cur
            cur = max(cur, rb)
            k += 1
        if cur < b:
            total += b - cur
    return total


def _restore_intervals(restores: Iterable[Restore]) -> list[tuple[float, float, tuple[str, ...]]]:
    out = []
    for r in restores:
        if len(r) == 3 and isinstance(r[2], tuple):
            out.append((float(r[0]), float(r[1]), tuple(r[2])))  # type: ignore[arg-type]
    return out


def idle_while_queued(records: Sequence[JobRecord], gpu_ids: Sequence[str],
                      eligible: Mapping[str, Collection[str]] | None = None,
                      restores: Iterable[Restore] = ()) -> float:
    """GPU-seconds a GPU was idle while a job it could have served waited.

    Args:
        records: the jobs, with submit/start/end times and GPUs.
        gpu_ids: every GPU of the fleet (GPUs that never ran anything count too).
        eligible: endpoint -> GPU uuids that could serve it; None: every GPU serves every
            endpoint.
        restores: ``(start_s, end_s, gpus)`` restore intervals (GPUs busy then).
    """
    busy: dict[str, list[Interval]] = {u: [] for u in gpu_ids}
    for r in records:
        for u in r.gpus:
            busy.setdefault(u, []).append((r.start_s, r.end_s))
    for a, b, gs in _restore_intervals(restores):
        for u in gs:
            busy.setdefault(u, []).append((a, b))
    waits_by_ep: dict[str, list[Interval]] = {}
    for r in records:
        waits_by_ep.setdefault(r.endpoint, []).append((r.submit_s, r.start_s))
    cache: dict[frozenset[str], list[Interval]] = {}
    total = 0.0
    for u, iv in busy.items():
        eps = frozenset(e for e in waits_by_ep if eligible is None or u in eligible.get(e, ()))
        if eps not in cache:
            cache[eps] = union(w for e in eps for w in waits_by_ep[e])
        total += minus_length(cache[eps], union(iv))
    return total


def build_report(records: Sequence[JobRecord], *, policy: str, gpus: int, submitted: int,
                 rejected: int = 0, preempted: int = 0, restores: Sequence[Restore] = (),
                 drain: dict[str, int] | None = None, solve_times_s: Sequence[float] = (),
                 lower_bound_makespan_s: float | None = None,
                 lower_bound_weighted_s: float | None = None,
                 gpu_ids: Sequence[str] | None = None,
                 eligible: Mapping[str, Collection[str]] | None = None) -> dict[str, Any]:
    """The report JSON object of the design notes ("Commands people run").

    Args:
        records: finished and failed jobs.
        policy: planner policy name.
        gpus: GPUs in the fleet.
        submitted, rejected, preempted: counts (preemptions, not distinct jobs).
        restores: set-point restores, each ``(start_s, end_s, gpus)`` (counted and its
            GPU-seconds added to transition time) or a bare ``gpus`` tuple (counted only).
        drain: ``{"leases", "agenda_entries", "busy_slots", "awaited_entries"}`` left after the
            run (a live run's drain check); zeros if None (a simulation has none left).
        solve_times_s: planner wall time per batch, s.
        lower_bound_makespan_s, lower_bound_weighted_s: from :func:`lower_bounds`.
        gpu_ids: every GPU uuid (default: the GPUs seen in records, padded to ``gpus``).
        eligible: endpoint -> GPU uuids that can serve it (default: all).

    Returns:
        dict with keys policy, gpus, jobs, weighted_completion_s, makespan_s, utilization,
        transition_gpu_s, idle_gpu_s, idle_while_queued_gpu_s, wait_s, transitions, drain,
        planner, lower_bounds, best_over_lower_bound (weighted completion ÷ its lower
        bound, None without one).
    """
    done = [r for r in records if r.status == "completed"]
    failed = sum(1 for r in records if r.status != "completed")
    if records:
        first = min(r.submit_s for r in records)
        makespan = max(r.end_s for r in records) - first
    else:
        makespan = 0.0
    weighted = sum(r.weight * (r.end_s - r.submit_s) for r in done)
    service_gpu_s = sum((r.end_s - r.service_start_s) * len(r.gpus) for r in records)
    trans_gpu_s = sum((r.service_start_s - r.start_s) * len(r.gpus) for r in records)
    rest = _restore_intervals(restores)
    trans_gpu_s += sum((b - a) * len(gs) for a, b, gs in rest)
    capacity = gpus * makespan
    if gpu_ids is None:
        seen = sorted({u for r in records for u in r.gpus})
        gpu_ids = seen + [f"_gpu{i}" for i in range(max(0, gpus - len(seen)))]
    waits: dict[str, list[float]] = {k: [] for k in LEVELS}
    for r in records:
        waits[LEVELS[min(max(int(r.priority), 0), 3)]].append(r.start_s - r.submit_s)
    solve = list(solve_times_s)
    wsum_lb = lower_bound_weighted_s
    return {
        "policy": policy,
        "gpus": gpus,
        "jobs": {"submitted": submitted, "completed": len(done), "failed": failed,
                 "rejected": rejected, "preempted": preempted},
        "weighted_completion_s": weighted,
        "makespan_s": makespan,
        "utilization": service_gpu_s / capacity if capacity > 0 else 0.0,
        "transition_gpu_s": trans_gpu_s,
        "idle_gpu_s": max(0.0, capacity - service_gpu_s - trans_gpu_s),
        "idle_while_queued_gpu_s": idle_while_queued(records, gpu_ids, eligible, restores),
        "wait_s": {k: {"p50": percentile(v, 50), "p95": percentile(v, 95)} for k, v in waits.items()},
        "transitions": {"evict": sum(len(r.evicts) for r in records),
                        "sleep": sum(len(r.sleeps) for r in records),
                        "sleep_level1": sum(r.sleep_levels.count(1) for r in records),
                        "sleep_level2": sum(r.sleep_levels.count(2) for r in records),
                        "cold_start": sum(1 for r in records if r.load == "cold_start"),
                        "wake": sum(1 for r in records if r.load == "wake"),
                        "restore": len(list(restores))},
        "drain": dict(drain) if drain is not None else {"leases": 0, "agenda_entries": 0, "busy_slots": 0,
                                                         "awaited_entries": 0},
        "planner": {"batches": len(solve), "solve_s_p50": round(percentile(solve, 50) or 0.0, 6),
                    "solve_s_p95": round(percentile(solve, 95) or 0.0, 6)},
        "lower_bounds": {"makespan_s": lower_bound_makespan_s, "weighted_completion_s": wsum_lb},
        "best_over_lower_bound": (weighted / wsum_lb) if wsum_lb else None,
    }


def eta_error(records: Sequence[JobRecord], eta_at_submit: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """ETA error per priority level: ``start_s − eta_at_submit[id]`` (s) of every record
    with an ETA. Returns ``{level: {"n", "p50", "p90", "mean"}}`` for every level of
    :data:`LEVELS` (``None`` figures where the level had no such job)."""
    errs: dict[str, list[float]] = {k: [] for k in LEVELS}
    for r in records:
        if r.id in eta_at_submit:
            errs[LEVELS[min(max(int(r.priority), 0), 3)]].append(r.start_s - eta_at_submit[r.id])
    return {k: {"n": len(v), "p50": percentile(v, 50), "p90": percentile(v, 90),
                "mean": sum(v) / len(v) if v else None} for k, v in errs.items()}


def lower_bounds(jobs: Sequence[PlanJob], endpoints: Mapping[str, EndpointModel], gpus: int | Sequence[Any],
                 resident: Collection[str] = ()) -> dict[str, float]:
    """Valid lower bounds for a set of jobs on ``gpus`` identical GPUs (setups ignored
    except where noted). Returns ``{"makespan_s", "weighted_completion_s"}``.

    Makespan (last completion − first release r_0), the design notes' bound, tightened:
        (a) every job j of endpoint e: C_j ≥ max(r_j, min_{i of e} r_i + setup_e) + p_j,
            where setup_e is the endpoint's cold start (its wake if it has a sleep mode)
            unless the endpoint is in ``resident`` (already loaded somewhere at the start):
            no instance of e is ready before its first job's release plus a load, and a
            later job of e may find that instance warm;
        (b) for every release time t, the jobs released at or after t need GPU area
            Σ tp_j·p_j inside [t, C_max] on G GPUs: C_max ≥ t + area(t)/G.
        t = r_0 gives the classic Σ tp·p / G.

    Weighted completion Σ w_j (C_j − r_j): the larger of
        (c) Σ w_j p_j (each job at least runs), and
        (d) the fluid single-machine bound. Any feasible schedule is also a fractional
            schedule on one machine of capacity G in which job j needs area a_j = tp_j p_j
            and runs at the constant rate tp_j during [S_j, C_j]; its mean busy time is
            M_j = C_j − p_j/2. Goemans (1997, "Improved approximation algorithms for
            scheduling with release dates", SODA) shows the preemptive schedule that
            always runs the released job of largest w_j/a_j at full rate minimises
            Σ w_j M_j over all preemptive (hence, by time-slicing, fractional) schedules
            with releases. So Σ w_j (C_j − r_j) = Σ w_j (M_j + p_j/2 − r_j)
            ≥ Σ w_j (M_j^LP + p_j/2 − r_j). Setups only lengthen schedules, and GPUs
            busy at the start only remove capacity, so both bounds stay valid.
    """
    g = gpus if isinstance(gpus, int) else len(gpus)
    if not jobs or g <= 0:
        return {"makespan_s": 0.0, "weighted_completion_s": 0.0}
    r0 = min(j.release_s for j in jobs)

    def setup(j: PlanJob) -> float:
        ep = endpoints[j.endpoint]
        if j.endpoint in resident:
            return 0.0
        return min(ep.cold_start_s, ep.wake_s) if ep.wake_s is not None else ep.cold_start_s

    area = {j.id: endpoints[j.endpoint].tp * j.service_s for j in jobs}
    # an instance loaded for the first job of an endpoint serves later ones warm: the earliest
    # any job of endpoint e can run is e's first release plus e's setup (a capacity planner's
    # live replay beat the bound that charged every job of e a setup)
    ready: dict[str, float] = {}
    for j in jobs:
        ready[j.endpoint] = min(ready.get(j.endpoint, math.inf), j.release_s + setup(j))
    mk = max(max(j.release_s, ready[j.endpoint]) + j.service_s for j in jobs) - r0
    by_r = sorted(jobs, key=lambda j: j.release_s)
    suffix = 0.0
    for j in reversed(by_r):
        suffix += area[j.id]
        mk = max(mk, j.release_s - r0 + suffix / g)
    trivial = sum(j.weight * j.service_s for j in jobs)
    mbt = _preemptive_wspt_mean_busy(by_r, {k: a / g for k, a in area.items()})
    fluid = sum(j.weight * (mbt[j.id] + j.service_s / 2.0 - j.release_s) for j in jobs)
    return {"makespan_s": mk, "weighted_completion_s": max(trivial, fluid)}


def _preemptive_wspt_mean_busy(by_release: Sequence[PlanJob], q: Mapping[str, float]) -> dict[str, float]:
    """Mean busy time of each job in the preemptive largest-w/q-first schedule on one
    machine (processing times ``q``, releases from the jobs)."""
    mean: dict[str, float] = {}
    left = dict(q)
    heap: list[tuple[float, int, str]] = []
    i, n, t = 0, len(by_release), by_release[0].release_s
    acc: dict[str, float] = {}
    while i < n or heap:
        if not heap:
            t = max(t, by_release[i].release_s)
        while i < n and by_release[i].release_s <= t:
            j = by_release[i]
            ratio = -(j.weight / q[j.id]) if q[j.id] > 0 else -math.inf
            heapq.heappush(heap, (ratio, i, j.id))
            i += 1
        _, _, jid = heap[0]
        nxt = by_release[i].release_s if i < n else math.inf
        run = min(left[jid], nxt - t)
        acc[jid] = acc.get(jid, 0.0) + run * (t + run / 2.0)
        left[jid] -= run
        t += run
        if left[jid] <= 1e-12:
            heapq.heappop(heap)
            mean[jid] = acc.get(jid, 0.0) / q[jid] if q[jid] > 0 else t
    return mean
