"""Local moves on a plan's sequence, scored by the replay (between CP-SAT windows).

A plan is read as a sequence: its assignments in start order, each with its GPU group.
:func:`decode_window` rebuilds a plan from that sequence with one slice replaced (prefix
as is, the slice in a new order and groups, suffix in its old order and groups, all at
their earliest starts through :class:`makespan.planner.replay.Replay`) and returns its score.
:func:`descent` tries, at each position, a swap with the next job and moves of the job to
other groups of its endpoint (those holding its model at that point, and the two that
free earliest), accepting the first move whose plan the evaluator scores lower
(first-improvement hill climbing; the classic swap/insert neighbourhoods of scheduling
local search, e.g. Congram, Potts & van de Velde 2002).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from makespan.planner.evaluator import InfeasiblePlan, evaluate, future_cost, rescore, score
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Group, Replay
from makespan.planner.restore import planned_absence


def decode_window(inc: Plan, lo: int, hi: int, order: list[str], groups: dict[str, Group],
                  jobs: dict[str, PlanJob], prefix: Replay, state: FleetState,
                  objective: str = "weighted_completion") -> tuple[list[Assignment], float]:
    """``inc`` with ``inc.assignments[lo:hi]`` replaced by ``order`` on ``groups`` (module
    doc); returns the assignments and their score for ``objective``, as
    :func:`makespan.planner.evaluator.evaluate` computes it (weight·s). ``prefix`` is the replay
    after ``inc.assignments[:lo]`` (not modified)."""
    rep = prefix.copy()
    out = list(inc.assignments[:lo])
    for jid in order:
        out.append(rep.place(jobs[jid], groups[jid]))
    for a in inc.assignments[hi:]:
        out.append(rep.place(jobs[a.job_id], a.gpus))
    total = sum(jobs[a.job_id].weight * (a.end_s - jobs[a.job_id].release_s) for a in out)
    fc = future_cost(rep, state)
    # the set-point term (FleetState.set_point_weight > 0) as the evaluator computes it; a
    # caller comparing this score as a filter would stay valid without it (a term ≥ 0)
    spc = state.set_point_weight * planned_absence(out, jobs, rep, state) if state.set_point_weight > 0 else 0.0
    if objective == "weighted_completion":
        return out, total + fc + spc
    tardy = sum(j.weight * (a.end_s - j.deadline_s) for a in out for j in [jobs[a.job_id]]
                if j.deadline_s is not None and a.end_s > j.deadline_s)
    stats = {"weighted_completion": total, "weighted_tardiness": tardy, "future_cost": fc, "set_point_cost": spc}
    return out, score(rescore(Plan("x", [], stats=stats), objective))


def _moves(inc: Plan, i: int, rep: Replay, jobs: dict[str, PlanJob], state: FleetState):
    """(lo, hi, order, groups) of the moves at position ``i``."""
    a = inc.assignments[i]
    if i + 1 < len(inc.assignments):
        b = inc.assignments[i + 1]
        yield i, i + 2, [b.job_id, a.job_id], {a.job_id: a.gpus, b.job_id: b.gpus}
    ep = state.endpoints[jobs[a.job_id].endpoint]
    gs = rep.job_groups(jobs[a.job_id])
    warm = [g for g in gs if all(rep.resident[u] == ep.name for u in g)]
    early = sorted(gs, key=rep.group_free)[:2]
    for g in dict.fromkeys(warm + early):
        if g != tuple(a.gpus):
            yield i, i + 1, [a.job_id], {a.job_id: g}


def descent(best: Plan, batch: Sequence[PlanJob], state: FleetState, deadline: float,
            objective: str = "weighted_completion") -> tuple[Plan, int]:
    """One first-improvement pass over the positions of ``best`` (a plan evaluated for
    ``objective``), until ``deadline`` (``time.perf_counter()`` seconds). Returns the best
    evaluated plan (never worse than ``best``) and the number of accepted moves."""
    jobs = {j.id: j for j in batch}
    rep = Replay(state)
    accepted = i = 0
    while i < len(best.assignments) and time.perf_counter() < deadline:
        for lo, hi, order, groups in _moves(best, i, rep, jobs, state):
            assigns, quick = decode_window(best, lo, hi, order, groups, jobs, rep, state, objective)
            if quick < score(best) - 1e-6:
                try:
                    cand = evaluate(assigns, batch, state, best.policy, objective=objective)
                except InfeasiblePlan:
                    continue
                if score(cand) < score(best) - 1e-6:
                    best, accepted = cand, accepted + 1
                    rep = Replay(state)  # the start order may have changed before i
                    for a in best.assignments[:i]:
                        rep.place(jobs[a.job_id], a.gpus, a.start_s)
                    break
        a = best.assignments[i]
        rep.place(jobs[a.job_id], a.gpus, a.start_s)
        i += 1
    return best, accepted
