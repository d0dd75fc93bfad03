"""The previous plan as a start for the next planning point (plan stability, issue 3).

Between two planning points jobs complete or are committed (they leave the batch), new
jobs arrive and the fleet moves on. :func:`repair` turns the previous plan into a
complete plan of the current batch: the jobs still in the batch keep their GPU group and
their relative start order, re-placed at their earliest feasible start on the current
fleet state through :class:`makespan.planner.replay.Replay` (the one transition rule); jobs that
are new (or whose group no longer fits their endpoint) are appended in WSPT order
(Smith 1956), each on the group that completes it earliest (the list-scheduling rule of
:mod:`makespan.planner.list_schedule`). Dependencies are kept: the order is made topological
with the fewest moves. The result goes through :func:`makespan.planner.evaluator.evaluate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from makespan.planner.evaluator import InfeasiblePlan, evaluate, score
from makespan.planner.list_schedule import topo_stable, wspt_order
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Group, Replay
from makespan.planner.rules import rule_completion


def repair(previous: Plan, batch: Sequence[PlanJob], state: FleetState, policy: str = "previous",
           objective: str = "weighted_completion") -> Plan | None:
    """The previous plan made a complete, evaluated plan of ``batch`` on ``state``.

    Args:
        previous: a plan of an earlier planning point (any batch; only ``job_id``,
            ``gpus`` and the start order of its assignments are used).
        batch: the jobs to place now.
        state: the fleet now (running work in ``free_at`` is never moved).
        objective: what the plan is scored for (:data:`makespan.planner.evaluator.OBJECTIVES`).

    Returns:
        the evaluated plan (``stats['kept']`` = jobs that kept their group), or None
        when ``batch`` is empty or the repaired plan fails the evaluator (it should not).
    """
    if not batch:
        return None
    jobs = {j.id: j for j in batch}
    rep = Replay(state)
    kept: dict[str, Group] = {}
    for a in sorted(previous.assignments, key=lambda a: (a.start_s, a.end_s)):
        job = jobs.get(a.job_id)
        if job is not None and a.job_id not in kept and tuple(a.gpus) in rep.job_groups(job):
            kept[a.job_id] = tuple(a.gpus)
    new = wspt_order([j for j in batch if j.id not in kept], state.endpoints)
    order = topo_stable([jobs[i] for i in kept] + new)
    out: list[Assignment] = []
    for job in order:
        grp = kept.get(job.id)
        if grp is None:
            grp = rule_completion(rep, job, rep.job_groups(job), rep.ready(job))
        out.append(rep.place(job, grp))
    try:
        plan = evaluate(out, batch, state, policy, objective=objective)
    except InfeasiblePlan:
        return None
    plan.stats["kept"] = float(len(kept))
    return plan


def start_plan(floor: Plan, previous: Plan | None, batch: Sequence[PlanJob], state: FleetState,
               objective: str = "weighted_completion") -> tuple[Plan, float, bool]:
    """(start, previous score, previous used): the repaired ``previous`` when it scores
    lower than ``floor`` (a plan of ``batch`` evaluated for ``objective``), else ``floor``. The score is
    NaN without a (repairable) previous plan."""
    if previous is None:
        return floor, math.nan, False
    rep = repair(previous, batch, state, objective=objective)
    if rep is None:
        return floor, math.nan, False
    if score(rep) < score(floor) - 1e-6:
        return rep, score(rep), True
    return floor, score(rep), False
