"""``plan(batch, fleet_state, policy) -> Plan``: the one entry point of the planner.

Policies are :class:`makespan.planner.policies.Policy` objects in one registry,
:data:`makespan.planner.policies.POLICY_REGISTRY` (their names, objectives, floors, descriptions
and solvers); the live planner worker and the simulator call :func:`plan` and nothing
else. Every policy returns a plan that went through
:func:`makespan.planner.evaluator.evaluate` (``objective`` = Σ w_j (C_j − r_j)).

Names: ``fifo``, ``min-evict``, ``wspt`` (fixed baselines, planner/greedy.py),
``portfolio`` (best of the greedy members), ``cpsat`` (portfolio + CP-SAT improver,
planner/cpsat.py) and ``default`` (= ``cpsat``). For jobs with deadlines:
``tardiness-portfolio`` and ``tardiness`` (planner/tardiness_policy.py) minimise the
weighted tardiness Σ w_j·max(0, C_j − d_j) instead (``Plan.objective`` is then that sum;
weighted completion is an ε tie-break, see planner/evaluator.py).

Plan-level preemption (``plan(..., preemption=True)`` with ``FleetState.running`` given,
:mod:`makespan.planner.preemption_plan`): the policies with a floor (:attr:`Policy.floor`) decide
preemptions by score — each candidate scored with the policy's greedy floor, the best
improving one taken — and a solver policy then runs on the chosen branch. When the floor
took any, a solver policy whose CP-SAT windows decide preemptions
(:attr:`Policy.window_preemption`: ``cpsat``/``default``, ``tardiness``) also solves the batch without them
(the state as given; its first window may re-take them, take others or none), with
:data:`UNDO_SHARE` of its time limit (the floor's branch gets the rest; that attempt's
first CP-SAT window, the one deciding preemptions, may use :data:`UNDO_WINDOW_SHARE` of
it), and the plan of lower :func:`comparable_score` is returned (ties: the floor's
branch), so the floor's decision can be undone; never worse than the floor's plan of its
branch.
``stats``: ``undo_branch`` (1: the branch without the floor's preemptions won),
``floor_preemptions_undone`` (the floor's preemptions not in the returned plan),
``floor_branch_score`` / ``base_branch_score`` (the two comparable scores, weight·s).
The returned plan carries ``preemptions``; evaluate it with
:func:`makespan.planner.preemption_plan.evaluate_preemptive`. The fixed baselines never do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from makespan.errors import PlannerError
from makespan.planner import fast_lane, preemption_plan, reservation
from makespan.planner.evaluator import score
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.planner.policies import DEFAULT_POLICY, POLICY_REGISTRY, Policy, SolveOptions
from makespan.planner.restore import RESTORE_AT, with_restores
from makespan.planner.sleepers import with_rule, with_upcoming

__all__ = ["DEFAULT_POLICY", "POLICY_REGISTRY", "Policy", "SolveOptions", "UNDO_SHARE", "UNDO_WINDOW_SHARE",
           "comparable_score", "lane_replan", "plan"]

# share of a solver policy's time limit spent solving the batch without the floor's
# preemptions (when the floor took any; the floor's branch gets the rest); 0: never undone
UNDO_SHARE = 0.1
# share of that attempt's limit its first CP-SAT window (the one that decides preemptions;
# makespan.planner.cpsat.improve's ``first_window_share``) may use, when the policy takes it; the
# rest of the attempt (descent, LNS) runs only when that window ends early
UNDO_WINDOW_SHARE = 1.0


def plan(batch: Sequence[PlanJob], state: FleetState, policy: str | Policy = DEFAULT_POLICY, *,
         time_limit_s: float | None = None, num_workers: int | None = None,
         previous: Plan | None = None, restore_at: str | None = None, preemption: bool = False,
         reserve_after_s: float | None = None, lane_levels: fast_lane.Levels = (),
         lane_start_grace_s: fast_lane.Grace | None = None, lane_preempt: bool = True) -> Plan:
    """Plan ``batch`` on ``state`` with ``policy``: a name in
    :data:`makespan.planner.policies.POLICY_REGISTRY`, or a :class:`Policy` (a benchmark's variant;
    its floor is looked up in the registry).

    Args:
        time_limit_s: wall-time limit of a time-limited policy (``cpsat``/``default``/
            ``tardiness``: the improver's budget after the greedy floor; default
            :attr:`Policy.time_limit_s`, 1 s; split between the two branches when
            ``preemption`` solves both, module doc), s. The greedy policies (``fifo``,
            ``min-evict``, ``wspt``, ``portfolio``, ``tardiness-portfolio``) take
            milliseconds and ignore it. None: the policy's own default.
        num_workers: CP-SAT search workers of a solver policy (``cpsat``/``default``/
            ``tardiness``; default 1, deterministic); ignored by the greedy policies. None:
            the policy's own default.
        previous: the plan of the last planning point (plan stability): a solver policy
            (``cpsat``/``default``) repairs it to ``batch`` (jobs gone dropped, new jobs
            appended, :func:`makespan.planner.previous.repair`) and starts from it when it scores
            better than the greedy floor; the greedy policies ignore it.
        restore_at: plan set-point restores after the policy's plan (``Plan.restores``,
            :func:`makespan.planner.restore.with_restores`; ``"group"`` or ``"horizon"``); None:
            no restores in the plan (the policy's plan as it is).
        preemption: decide preemptions inside the plan (module doc) when the policy has a
            floor (:attr:`Policy.floor`) and ``state.running`` is given; ignored otherwise.
        reserve_after_s: the aging bound, s: a job that has waited this long gets a
            reservation with backfill (:func:`makespan.planner.reservation.enforce`, applied to the
            policy's plan, before restores; the plan's ``stats['reserved']`` = 1 when a job
            holds one); None (the default): no reservations, the policy's plan as it is.
        lane_levels: the fast lane's priority levels, or level -> factor
            (:mod:`makespan.planner.fast_lane`: no job of these levels planned to complete
            later than release + factor × the response time strict priority would give it
            from ``state``; applied after the reservation; ``stats['fast_lane_late']`` =
            how many the policy had planned later); () (the default): none.
        lane_start_grace_s: the lane levels bounded on their start instead of their
            completion, level -> grace s or (grace s, wait floor s)
            (:mod:`makespan.planner.fast_lane`, "Start bound" and "Wait floor": no such job
            planned to start later than release + factor × strict priority's wait + grace,
            nor forced before release + floor); None (the default): every lane level bounded on completion.
        lane_preempt: with ``preemption``, a start-bounded lane job that strict priority's
            preemption rule would start now by preempting takes that preemption before the
            scored ones (:mod:`makespan.planner.fast_lane`, "Preemption"; default True).

    Raises:
        PlannerError: unknown policy name (the message lists the known ones) or
            ``restore_at``, a negative ``time_limit_s``, or ``num_workers`` < 1.
    """
    if time_limit_s is not None and time_limit_s < 0:
        raise PlannerError(f"time_limit_s must be >= 0, got {time_limit_s}")
    if num_workers is not None and num_workers < 1:
        raise PlannerError(f"num_workers must be >= 1, got {num_workers}")
    chosen = POLICY_REGISTRY.lookup(policy)
    if restore_at is not None and restore_at not in RESTORE_AT:
        raise PlannerError(f"unknown restore_at {restore_at!r}; known: {', '.join(RESTORE_AT)}")
    if not batch:
        empty = Plan(policy=chosen.name, assignments=[])
        return with_restores(empty, batch, state, restore_at) if restore_at is not None else empty
    state = with_rule(with_upcoming(state, batch), chosen.name)  # the transition choice's forecast and rule
    options = SolveOptions(time_limit_s=time_limit_s, num_workers=num_workers, previous=previous)
    if preemption and state.running and chosen.floor is not None:
        return _plan_preemptive(batch, state, chosen, options, restore_at, reserve_after_s, lane_levels, lane_start_grace_s,
                                lane_preempt)
    p = chosen.solve(batch, state, options)
    p = _lane(_reserve(p, batch, state, chosen, reserve_after_s), batch, state, chosen, lane_levels, lane_start_grace_s)
    return with_restores(p, batch, state, restore_at) if restore_at is not None else p


def _reserve(p: Plan, batch: Sequence[PlanJob], state: FleetState, policy: Policy, after_s: float | None) -> Plan:
    """``p`` with the aged job's reservation honoured (:mod:`makespan.planner.reservation`)."""
    if after_s is None:
        return p
    out, res = reservation.enforce(p, batch, state, after_s, policy.objective)
    if res:
        out.stats["reserved"] = 1.0
    return out


def _lane(p: Plan, batch: Sequence[PlanJob], state: FleetState, policy: Policy, levels: fast_lane.Levels,
          start_grace_s: fast_lane.Grace | None = None) -> Plan:
    """``p`` with the fast lane's levels no later than strict priority (:mod:`makespan.planner.fast_lane`;
    the re-plan of the other jobs: :func:`lane_replan`)."""
    if not levels:
        return p
    return fast_lane.enforce(p, batch, state, levels, objective=policy.objective, replan=lane_replan(policy),
                             start_grace_s=start_grace_s)[0]


def lane_replan(policy: str | Policy) -> Callable[[Sequence[PlanJob], FleetState], Plan]:
    """``(batch, state) -> Plan``: the policy that re-plans the other jobs around the fast
    lane's placements: the policy's floor (:attr:`Policy.floor`, ``portfolio`` for the
    ``cpsat`` policies), or the policy itself when it has none (the fixed baselines).

    Raises:
        PlannerError: an unknown policy name."""
    chosen = POLICY_REGISTRY.lookup(policy)
    return (POLICY_REGISTRY.floor_of(chosen) or chosen).solve


def comparable_score(p: Plan, state: FleetState, objective: str) -> float:
    """The score of an assembled plan ``p`` (its ``stats['score']``: preemptors, rest,
    victims) plus the running jobs it does not cut at their original completions
    (:func:`makespan.planner.preemption_plan.fixed_score`), plus the work the jobs it cuts
    already did (:data:`makespan.planner.preemption_plan.LOST_WORK_WEIGHT` × w·(now − start)),
    weight·s: the same jobs whatever the plan cuts, so plans of different preemption
    decisions compare (as :func:`makespan.planner.preemption_plan.decide` compares them)."""
    cut = {v for x in p.preemptions for v in x.victims}
    kept = {h.id: h for h in state.running.values() if h.id not in cut}
    lost = {h.id: h for h in state.running.values() if h.id in cut}  # their work done so far is thrown away
    return (score(p) + preemption_plan.fixed_score([(h.job, h.end_s) for h in kept.values()], objective)
            + preemption_plan.LOST_WORK_WEIGHT * sum(h.weight * max(0.0, state.now_s - h.start_s)
                                                     for h in lost.values()))


def _solve_branch(branch: preemption_plan.Branch, policy: Policy, options: SolveOptions,
                  objective: str) -> tuple[Plan, preemption_plan.Branch]:
    """(rest, branch): ``policy``'s plan of the branch's batch on its state, with the
    preemptions its windows took split off and chained onto the branch."""
    rest = policy.solve(branch.batch, branch.state, options)
    if rest.preemptions:  # taken by the solver, on the branch's state
        inner, rest = preemption_plan.split(rest, branch.batch, branch.state, objective)
        branch = preemption_plan.chain(branch, inner)
        rest.stats["window_preemptions"] = float(len(inner.taken))
    return rest, branch


def _plan_preemptive(batch: Sequence[PlanJob], state: FleetState, policy: Policy, options: SolveOptions,
                     restore_at: str | None = None, reserve_after_s: float | None = None,
                     lane_levels: fast_lane.Levels = (), lane_start_grace_s: fast_lane.Grace | None = None,
                     lane_preempt: bool = True) -> Plan:
    """The lane's rule preemptions (:func:`makespan.planner.fast_lane.rule_preemptions`, when
    ``lane_preempt``), then scored preemption with the policy's floor, then the policy on the chosen branch (a
    policy with :attr:`Policy.window_preemption` may cut more jobs there: its CP-SAT windows
    decide them, :mod:`makespan.planner.window_preemption`). When the floor took preemptions, such
    a policy also solves the batch without them (the base state, its windows free to
    re-take them, take others or none) with :data:`UNDO_SHARE` of the time limit, and the
    plan of lower :func:`comparable_score` is kept (ties: the floor's branch). Restores
    (``restore_at``) are placed on the state the kept plan's preemptions leave."""
    floor = POLICY_REGISTRY.floor_of(policy)
    assert floor is not None  # plan() calls this only for a policy with a floor
    objective = policy.objective
    forced = preemption_plan.Branch(state, list(batch), None, [], [], [])
    if lane_preempt and lane_levels:  # the lane's rule preemptions first (fast_lane, "Preemption")
        forced = fast_lane.rule_preemptions(forced, lane_levels, lane_start_grace_s)
    branch = preemption_plan.decide(forced.batch, forced.state, floor.solve, objective)
    if forced.taken:
        branch = replace(preemption_plan.chain(forced, branch), plan=branch.plan)
    undo_stats: dict[str, float] = {}
    if floor.name == policy.name and branch.plan is not None:  # the floor's plan of the branch is the policy's
        rest = branch.plan
    elif not policy.window_preemption:
        rest, branch = _solve_branch(branch, policy, options, objective)
    else:
        options = replace(options, preemptors=frozenset(j.id for j in batch))  # not the victims just cut
        limit = options.time_limit_s if options.time_limit_s is not None else policy.time_limit_s
        if not branch.taken or UNDO_SHARE <= 0.0 or limit is None:
            rest, branch = _solve_branch(branch, policy, options, objective)
        else:
            floor_taken = list(branch.taken)
            rest, branch = _solve_branch(branch, policy, replace(options, time_limit_s=limit * (1.0 - UNDO_SHARE)),
                                         objective)
            base = replace(forced, plan=None)  # without the scored preemptions (the lane's stay)
            undo_options = replace(options, time_limit_s=limit * UNDO_SHARE, first_window_share=UNDO_WINDOW_SHARE)
            rest0, base = _solve_branch(base, policy, undo_options, objective)
            s_floor = comparable_score(preemption_plan.assemble(rest, branch, objective), state, objective)
            s_base = comparable_score(preemption_plan.assemble(rest0, base, objective), state, objective)
            undone = s_base < s_floor - preemption_plan.MIN_GAIN
            if undone:
                rest, branch = rest0, base
            kept = {(p.job_id, tuple(p.gpus)) for p in branch.taken}
            undo_stats = {"undo_branch": float(undone), "floor_branch_score": s_floor, "base_branch_score": s_base,
                          "floor_preemptions_undone": float(sum((p.job_id, tuple(p.gpus)) not in kept
                                                                for p in floor_taken))}
    rest = _reserve(rest, branch.batch, branch.state, policy, reserve_after_s)
    rest = _lane(rest, branch.batch, branch.state, policy, lane_levels, lane_start_grace_s)
    if restore_at is not None:
        rest = with_restores(rest, branch.batch, branch.state, restore_at)
    out = preemption_plan.assemble(rest, branch, objective)
    out.stats.update(undo_stats)
    return out
