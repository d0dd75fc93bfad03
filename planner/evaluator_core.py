"""Replay and scoring of a plan without preemptions: the checks and the score that
:mod:`makespan.planner.evaluator` documents (read it there).

:func:`makespan.planner.evaluator.evaluate` is the entry every candidate plan goes
through; it sends a plan with preemptions to
:func:`makespan.planner.preemption_plan.evaluate_preemptive`, which applies them and
evaluates the rest here. This module imports neither of them, so the planner's imports
have no cycle (pyproject's ``[tool.importlinter]``).
"""
from __future__ import annotations

from collections.abc import Sequence

from makespan.errors import PlannerError
from makespan.planner.future_cost import future_cost
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.restore import RESTORE_PREFIX, is_restore, planned_absence, set_point_groups
from makespan.planner.sleepers import with_rule

TOL_S = 1e-6
OBJECTIVES = ("weighted_completion", "weighted_tardiness")
TARDINESS_EPS = 1e-6  # weight of Σ w(C − r) + future cost in the weighted-tardiness score


class InfeasiblePlan(PlannerError):
    """A plan violates the model; ``reason`` says how and for which job."""

    def __init__(self, job_id: str, reason: str):
        self.job_id = job_id
        self.reason = reason
        super().__init__(f"job {job_id}: {reason}")


def evaluate_without_preemptions(plan: Plan | Sequence[Assignment], batch: Sequence[PlanJob], state: FleetState,
                                 policy: str | None = None, check_times: bool = True,
                                 objective: str = "weighted_completion") -> Plan:
    """Replay ``plan`` on ``state`` and return it re-derived and scored.

    Args:
        plan: a plan or its assignments (only ``job_id``, ``gpus`` and ``start_s`` drive the
            replay; the rest is checked when ``check_times``).
        batch: the jobs the plan must place.
        state: fleet state at planning time.
        policy: name for the returned plan (default: the input plan's); ``fifo`` and
            ``min-evict`` replay with ``transition_rule`` ``"stop"``
            (:func:`makespan.planner.sleepers.with_rule`). ``state`` is replayed as given: a
            plan :func:`makespan.planner.api.plan` made on a fleet with ``sleep_options`` is
            replayed on the state with the forecast it was made with (``with_upcoming(state,
            batch)``, what ``plan`` passes its policy).
        check_times: also require the stated service start, completion, evicts and load
            kind to equal the replay's.
        objective: one of :data:`OBJECTIVES` (:mod:`makespan.planner.evaluator`).

    A plan with ``preemptions`` is not evaluated here: :func:`makespan.planner.evaluator.evaluate`
    replays it (through :func:`makespan.planner.preemption_plan.evaluate_preemptive`).

    Returns:
        a new :class:`Plan` with replayed assignments in start order, ``objective`` =
        Σ w_j (C_j − r_j) or Σ w_j·max(0, C_j − d_j) (weight·s) and ``stats`` {score,
        future_cost, weighted_completion, weighted_tardiness, cold_starts, wakes, evicts;
        set_point_absent_gpu_s and set_point_cost when ``state.set_point_weight`` > 0}.

    Raises:
        InfeasiblePlan: the first violation found.
        PlannerError: unknown ``objective``, or ``plan`` has preemptions.
    """
    if objective not in OBJECTIVES:
        raise PlannerError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if isinstance(plan, Plan) and plan.preemptions:
        raise PlannerError("a plan with preemptions is evaluated by makespan.planner.evaluator.evaluate")
    assigns = list(plan.assignments if isinstance(plan, Plan) else plan)
    name = policy or (plan.policy if isinstance(plan, Plan) else "plan")
    jobs = {j.id: j for j in batch}
    seen: set[str] = set()
    for a in assigns:
        if a.job_id not in jobs:
            raise InfeasiblePlan(a.job_id, "not in the batch")
        if a.job_id in seen:
            raise InfeasiblePlan(a.job_id, "placed twice")
        seen.add(a.job_id)
    missing = [j for j in jobs if j not in seen]
    if missing:
        raise InfeasiblePlan(missing[0], f"not placed ({len(missing)} jobs missing)")
    state = with_rule(state, name)  # fifo and min-evict stop displaced sleepers (the transition choice)
    rep = Replay(state)
    valid: dict[str, set[tuple[str, ...]]] = {}
    order = sorted(range(len(assigns)), key=lambda i: (assigns[i].start_s, i))
    out: list[Assignment] = []
    for i in order:
        a = assigns[i]
        job = jobs[a.job_id]
        ep = state.endpoints.get(job.endpoint)
        if ep is None:
            raise InfeasiblePlan(job.id, f"unknown endpoint {job.endpoint!r}")
        kind = ep.name if not job.narrowed else f"{ep.name}+{'+'.join(job.helpers)}@{','.join(job.hosts)}"
        if kind not in valid:
            valid[kind] = set(rep.job_groups(job))
        if tuple(a.gpus) not in valid[kind]:
            raise InfeasiblePlan(job.id, f"GPU group {a.gpus} is not an aligned TP-{ep.tp} group "
                                         f"with {ep.memory_mib} MiB per GPU"
                                 + (f" and room for its helpers {', '.join(job.helpers)}" if job.helpers else "")
                                 + (f" on its hosts {', '.join(job.hosts)}" if job.hosts else ""))
        for d in job.deps:
            if d in jobs and d not in rep.end_of:
                raise InfeasiblePlan(job.id, f"starts at {a.start_s} before its dependency {d} starts")
        ready = rep.ready(job)
        if a.start_s < ready - TOL_S:
            raise InfeasiblePlan(job.id, f"starts at {a.start_s} before it is ready at {ready} "
                                         "(release, now or dependencies)")
        busy = rep.group_free(tuple(a.gpus))
        if a.start_s < busy - TOL_S:
            raise InfeasiblePlan(job.id, f"starts at {a.start_s} while its GPUs are busy until {busy}")
        b = rep.place(job, tuple(a.gpus), a.start_s)
        if check_times and (abs(b.service_start_s - a.service_start_s) > TOL_S or abs(b.end_s - a.end_s) > TOL_S
                            or b.load != a.load or tuple(b.evicts) != tuple(a.evicts)):
            raise InfeasiblePlan(job.id, f"stated times/transition {a.service_start_s, a.end_s, a.load, a.evicts} "
                                         f"differ from the replay {b.service_start_s, b.end_s, b.load, b.evicts}")
        out.append(b)
    absent = planned_absence(out, jobs, rep, state) if state.set_point_weight > 0 else None  # before the restores
    restored = _replay_restores(plan.restores if isinstance(plan, Plan) else [], rep, state, check_times)
    return _scored(name, out, jobs, rep, state, restored, objective, absent)


def evaluate_built(assigns: Sequence[Assignment], rep: Replay, batch: Sequence[PlanJob], state: FleetState,
                   policy: str) -> Plan:
    """The plan ``evaluate_without_preemptions(assigns, batch, state, policy, check_times=False)`` returns, for
    assignments that ``rep`` (a :class:`Replay` of ``state``) placed, in this order, each at
    or after the time its group was free (a list-scheduling construction), without
    replaying them a second time: every GPU's placements are then in start order (ties:
    placement order), the order the evaluator replays them in, so its replay would give
    the same assignments and leave ``rep``'s state. Checks only that every batch job is
    placed exactly once (:class:`InfeasiblePlan`); the construction ensures the rest."""
    jobs = {j.id: j for j in batch}
    if len(assigns) != len(jobs) or len({a.job_id for a in assigns} & jobs.keys()) != len(jobs):
        evaluate_without_preemptions(assigns, batch, state, policy, check_times=False)  # raises, naming the violation
    order = sorted(range(len(assigns)), key=lambda i: (assigns[i].start_s, i))
    out = [assigns[i] for i in order]
    absent = planned_absence(out, jobs, rep, state) if state.set_point_weight > 0 else None
    return _scored(policy, out, jobs, rep, state, [], "weighted_completion", absent)


def _scored(name: str, out: list[Assignment], jobs: dict[str, PlanJob], rep: Replay, state: FleetState,
            restored: list[Assignment], objective: str, absent: float | None = None) -> Plan:
    """The scored plan of replayed assignments ``out`` (start order) and restores;
    ``rep``: the replay after them; ``absent``: the plan's set-point absence, GPU-s (None:
    not weighed, ``set_point_weight`` 0)."""
    total = tardy = 0.0
    for b in out:
        job = jobs[b.job_id]
        total += job.weight * (b.end_s - job.release_s)
        if job.deadline_s is not None and b.end_s > job.deadline_s:
            tardy += job.weight * (b.end_s - job.deadline_s)
    fc = future_cost(rep, state)
    stats = {"score": total + fc, "future_cost": fc, "weighted_completion": total, "weighted_tardiness": tardy,
             "cold_starts": float(sum(1 for b in out if b.load == "cold_start")),
             "wakes": float(sum(1 for b in out if b.load == "wake")),
             "evicts": float(sum(len(b.evicts) for b in out))}
    if restored:
        stats["restores"] = float(len(restored))
    if absent is not None:
        stats["set_point_absent_gpu_s"] = absent
        stats["set_point_cost"] = state.set_point_weight * absent
    return rescore(Plan(policy=name, assignments=out, objective=total, stats=stats, restores=restored), objective)


def _replay_restores(restores: Sequence[Assignment], rep: Replay, state: FleetState,
                     check_times: bool) -> list[Assignment]:
    """Replay a plan's set-point restores (:mod:`makespan.planner.restore`) after its jobs, in start
    order: each on a set-point instance of ``state``, not before the planning time, and
    the last work on its GPUs (it starts when every job there has ended: a restore never
    overlaps or delays a job). Returns the replayed restores; InfeasiblePlan otherwise."""
    out: list[Assignment] = []
    seen: set[tuple[str, ...]] = set()
    instances = set(set_point_groups(state)) if restores else set()
    for a in sorted(restores, key=lambda a: (a.start_s, a.gpus)):
        g = tuple(a.gpus)
        if g in seen:
            raise InfeasiblePlan(a.job_id, "restored twice")
        seen.add(g)
        ep = state.set_point.get(g[0]) if g else None
        if not is_restore(a) or ep is None or a.job_id != f"{RESTORE_PREFIX}{ep}:{g[0]}" \
                or (ep, g) not in instances:
            raise InfeasiblePlan(a.job_id, f"not a restore of a set-point instance (GPUs {g})")
        busy = max(rep.group_free(g), state.now_s)
        if a.start_s < busy - TOL_S:
            raise InfeasiblePlan(a.job_id, f"restore starts at {a.start_s} while its GPUs are busy until {busy} "
                                           "(a restore is the last work on its GPUs)")
        b = rep.restore(g, ep, a.start_s)
        if check_times and (abs(b.end_s - a.end_s) > TOL_S or b.load != a.load or tuple(b.evicts) != tuple(a.evicts)):
            raise InfeasiblePlan(a.job_id, f"stated restore {a.end_s, a.load, a.evicts} differs from the replay "
                                           f"{b.end_s, b.load, b.evicts}")
        out.append(b)
    return out


def rescore(plan: Plan, objective: str) -> Plan:
    """Set ``plan.objective`` and ``stats['score']`` of an evaluated plan for ``objective``
    (:mod:`makespan.planner.evaluator`) from its stats, in place; returns it. Raises PlannerError if unknown."""
    st = plan.stats
    if objective == "weighted_completion":
        plan.objective = st["weighted_completion"]
        st["score"] = st["weighted_completion"] + st["future_cost"]
    elif objective == "weighted_tardiness":
        plan.objective = st["weighted_tardiness"]
        st["score"] = st["weighted_tardiness"] + TARDINESS_EPS * (st["weighted_completion"] + st["future_cost"])
    else:
        raise PlannerError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if "set_point_cost" in st:  # set_point_weight > 0 (:mod:`makespan.planner.evaluator`), at full weight for either objective
        st["score"] += st["set_point_cost"]
    return plan


def score(plan: Plan) -> float:
    """The selection score of an evaluated plan (objective + future cost + set-point cost)."""
    return plan.stats.get("score", plan.objective)
