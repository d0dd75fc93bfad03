"""Exact replay and scoring of a plan; every candidate plan goes through :func:`evaluate`
(a greedy construction through :func:`evaluate_built`: the same result, from the replay
that built it).

Checks (an :class:`InfeasiblePlan` names the first violation):
    * every batch job is placed exactly once, and nothing else is;
    * the GPU group is an aligned group of the endpoint's TP size within one host whose
      GPUs all have the endpoint's memory (``FleetState.groups``);
    * the start is not before the job's release, the planning time, its dependencies'
      completion, nor the time its GPUs become free (running work, earlier jobs);
    * the stated transition (evicts, load kind) and the service start / completion agree
      with the replay (:mod:`makespan.planner.replay`) within 1 µs;
    * set-point restores (``Plan.restores``, :mod:`makespan.planner.restore`) are replayed after
      the jobs: each restores a set-point instance of the state, starts when every job on
      its GPUs has ended (never overlapping nor delaying one) and agrees with the replay.

Score (used to pick among candidates) = Σ w_j (C_j − r_j) + future cost, where the
future cost charges ``demand[e] × cold_start_s(e)`` for every endpoint ``e`` with recent
demand that was resident at the start and holds no whole instance when the plan ends (the next
arrival of ``e`` will pay a cold start). When ``state.demand_share`` is given the term is
the share shortfall instead: Σ_e d_e × cold_start_s(e) × max(0, share_e·G − n_e) / tp_e,
with G the fleet's GPUs, n_e the GPUs in whole instances of ``e`` when the plan ends and d_e =
``demand[e]`` (mean weight, 1 if absent) — an endpoint left with fewer instances than its
share of recent work will pay that many more cold starts (a plan that keeps popular
models loaded scores better). ``Plan.objective`` is the pure Σ w_j (C_j − r_j).

Set-point term (only when ``FleetState.set_point_weight`` w_sp > 0): score += w_sp × the
set-point absence the plan causes (GPU-s, :func:`makespan.planner.restore.planned_absence`: each
set-point instance from when the plan evicts it, or ``now`` if it is absent already,
until its restore at ``"group"`` ends), for either objective; ``stats`` gains
``set_point_absent_gpu_s`` and ``set_point_cost`` (= w_sp × that, weight·s). At w_sp = 0
nothing is computed and the stats are as before.

Objective ``weighted_tardiness`` (jobs with a deadline, :data:`OBJECTIVES`):
``Plan.objective`` = Σ_j w_j·max(0, C_j − d_j) over the jobs with ``deadline_s`` d_j (the
others never count), and score = that + ε·(Σ_j w_j (C_j − r_j) + future cost) with
ε = :data:`TARDINESS_EPS` = 1e-6: weighted completion of every job (deadline or not) is
a tie-break — among plans of equal weighted tardiness the one finishing work earlier
wins, and a batch without deadlines is ordered exactly as by weighted completion. With
integer data and Σ w_j (C_j − r_j) + future cost < 1e6 weight·s the tie-break never
outweighs one weight·s of tardiness. Both sums are in ``stats`` for either objective
(``weighted_tardiness``, ``weighted_completion``).
"""

from __future__ import annotations

from collections.abc import Sequence

from makespan.planner.evaluator_core import (OBJECTIVES, TARDINESS_EPS, TOL_S, InfeasiblePlan, evaluate_built,
                                             evaluate_without_preemptions, rescore, score)
from makespan.planner.future_cost import future_cost, share_shortfall_cost
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.preemption_plan import evaluate_preemptive

__all__ = ["OBJECTIVES", "TARDINESS_EPS", "TOL_S", "InfeasiblePlan", "evaluate", "evaluate_built",
           "evaluate_retimed", "evaluate_without_preemptions", "future_cost", "rescore", "score",
           "share_shortfall_cost"]

RETIME_ROUNDS = 3  # re-timing passes evaluate_retimed tries before it gives up


def evaluate(plan: Plan | Sequence[Assignment], batch: Sequence[PlanJob], state: FleetState,
             policy: str | None = None, check_times: bool = True,
             objective: str = "weighted_completion") -> Plan:
    """Replay ``plan`` on ``state`` and return it re-derived and scored.

    Args:
        plan: a plan or its assignments (only ``job_id``, ``gpus`` and ``start_s`` drive the
            replay; the rest is checked when ``check_times``).
        batch: the jobs the plan must place.
        state: fleet state at planning time.
        policy: name for the returned plan (default: the input plan's).
        check_times: also require the stated service start, completion, evicts and load
            kind to equal the replay's.
        objective: one of :data:`OBJECTIVES` (module doc).

    A plan with ``preemptions`` (plan-level preemption) is replayed by
    :func:`makespan.planner.preemption_plan.evaluate_preemptive` (its preemptions applied to
    ``state`` first, checked against the preemption rules; every job it places is scored);
    any other by :func:`makespan.planner.evaluator_core.evaluate_without_preemptions`.

    Returns:
        a new :class:`Plan` with replayed assignments in start order, ``objective`` =
        Σ w_j (C_j − r_j) or Σ w_j·max(0, C_j − d_j) (weight·s) and ``stats`` (as
        :func:`~makespan.planner.evaluator_core.evaluate_without_preemptions` says).

    Raises:
        InfeasiblePlan: the first violation found.
        PlannerError: unknown ``objective``.
    """
    if isinstance(plan, Plan) and plan.preemptions:  # replayed on the state its preemptions leave
        return evaluate_preemptive(plan, batch, state, objective, policy=policy, check_times=check_times)
    return evaluate_without_preemptions(plan, batch, state, policy, check_times, objective)


def evaluate_retimed(assignments: Sequence[Assignment], batch: Sequence[PlanJob], state: FleetState,
                     policy: str, objective: str = "weighted_completion") -> Plan | None:
    """The plan of ``assignments`` (no preemptions) evaluated with its times re-derived, or
    None when no consistent timing was found.

    A construction places jobs in its own order and the evaluator replays them in start
    order. Where a transition depends on that order (which sleepers a host's RAM budget
    still holds, :mod:`makespan.planner.sleepers`: a wake in the construction can be a cold
    start in the replay), a start can fall before its GPUs are free in the replay
    (:class:`InfeasiblePlan`). Then the jobs are placed again at their earliest times in
    start order on their groups (:class:`makespan.planner.replay.Replay`) and evaluated,
    up to RETIME_ROUNDS times: the groups and the order are kept, the times are the
    replay's.

    Returns:
        the evaluated plan (``stats['retimed']``: the passes it took, absent when none), or None."""
    from makespan.planner.replay import Replay

    jobs = {job.id: job for job in batch}
    current = list(assignments)
    for round_number in range(RETIME_ROUNDS + 1):
        try:
            out = evaluate_without_preemptions(current, batch, state, policy, False, objective)
        except InfeasiblePlan:
            replay = Replay(state)
            current = [replay.place(jobs[a.job_id], tuple(a.gpus))
                       for a in sorted(current, key=lambda a: (a.start_s, a.end_s))]
            continue
        if round_number:
            out.stats["retimed"] = float(round_number)
        return out
    return None
