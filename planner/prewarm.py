"""Prewarm: load endpoints in demand on GPUs that a plan leaves idle.

A job that arrives for an endpoint no idle GPU holds pays a cold start although GPUs were
idle before it came. When ``FleetState.demand_share`` is known, :func:`prewarm_loads`
takes the GPU groups that are free now and that the plan gives no job, and loads on them
the endpoints whose share of recent work most exceeds the GPUs they will hold when the
plan ends — one group at a time, each time the load that lowers the evaluator's
share-shortfall term (:func:`planner.evaluator.share_shortfall_cost`) the most, net of
what the evicted endpoint loses; it stops when no load lowers it. The loads start now
(:class:`planner.model.Load`). :func:`with_prewarm` keeps them only when the evaluated
plan scores better (a scored option; the jobs' times are unchanged, since no job of the
plan uses those GPUs).

Executed by the simulator (committed like the jobs that start in its window; counted as
restores in the report); the live planner worker does not execute loads without a job.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.evaluator import evaluate, score, share_shortfall_cost
from planner.model import FleetState, Load, Plan, PlanJob
from planner.replay import Group, Replay


def prewarm_loads(plan: Plan, batch: Sequence[PlanJob], state: FleetState,
                  max_groups: int | None = None) -> list[Load]:
    """Loads without a job for ``plan`` (module doc); empty without ``demand_share``.

    Args:
        plan: an evaluated plan of ``batch`` on ``state``.
        max_groups: at most this many loads (None: no limit).
    """
    if not state.demand_share:
        return []
    jobs = {j.id: j for j in batch}
    now = Replay(state)
    end = Replay(state)
    last: dict[str, tuple[float, str]] = {}
    for a in plan.assignments:
        ep_name = jobs[a.job_id].endpoint
        for u in a.gpus:
            if u not in last or a.start_s >= last[u][0]:
                last[u] = (a.start_s, ep_name)
    for u, (_, e) in last.items():
        end.resident[u] = e
    end.count = {}
    for e in end.resident.values():
        if e is not None:
            end.count[e] = end.count.get(e, 0) + 1
    idle = {g.uuid for g in state.gpus if now.free_at[g.uuid] <= state.now_s and g.uuid not in last}
    out: list[Load] = []
    while idle and (max_groups is None or len(out) < max_groups):
        best: tuple[float, Group, str] | None = None
        for e in sorted(state.demand_share):
            ep = state.endpoints.get(e)
            if ep is None or state.demand_share[e] <= 0:
                continue
            n = end.whole_gpus(e)
            gain = share_shortfall_cost(state, e, n) - share_shortfall_cost(state, e, n + ep.tp)
            if gain <= 0 or (best is not None and gain <= best[0]):
                continue
            for g in now.groups(ep):
                if not all(u in idle for u in g) or all(end.resident[u] == e for u in g):
                    continue
                net = gain - _loss(end, state, g, e)
                if net > 0 and (best is None or net > best[0]):
                    best = (net, g, e)
        if best is None:
            break
        _, g, e = best
        out.append(now.load(g, state.endpoints[e], state.now_s))
        end.load(g, state.endpoints[e], state.now_s)
        idle.difference_update(g)
    return out


def _loss(end: Replay, state: FleetState, g: Group, name: str) -> float:
    """Rise of the shortfall term of the endpoints evicted from ``g`` (weight·s)."""
    d = 0.0
    for e in {end.resident[u] for u in g} - {None, name}:
        k = end.whole_lost(g, e)  # type: ignore[arg-type]
        if k:
            c = end.whole_gpus(e)  # type: ignore[arg-type]
            d += share_shortfall_cost(state, e, c - k) - share_shortfall_cost(state, e, c)  # type: ignore[arg-type]
    return d


def with_prewarm(plan: Plan, batch: Sequence[PlanJob], state: FleetState, max_groups: int | None = None) -> Plan:
    """``plan`` with its prewarm loads when the evaluated result scores better, else ``plan``."""
    loads = prewarm_loads(plan, batch, state, max_groups)
    if not loads:
        return plan
    cand = evaluate(Plan(plan.policy, plan.assignments, loads=loads), batch, state, check_times=False)
    if score(cand) < score(plan):
        cand.stats = {**plan.stats, **cand.stats}
        return cand
    return plan
