"""Preemption decided inside the plan, by score (pure: no Redis, no clock).

The fixed rule (:mod:`makespan.planner.preemption`) preempts whenever its conditions hold; here a
preemption is a planning decision traded against waiting. Given the batch and a
:class:`~makespan.planner.model.FleetState` whose ``running`` names the jobs holding GPUs now:

Candidates (the design rules, "Preemption"): for a waiting job of level CRITICAL (0) or
HIGH (1) that can start now (released, every dependency done) and that no GPU group free
now can take, a GPU group of its endpoint every GPU of which is free now or held by a
running, started, preemptable job of a strictly lower level (CRITICAL preempts
HIGH/NORMAL/LOW, HIGH preempts NORMAL/LOW) that no batch job depends on, at least one
held (a group partly free and partly held by lower-priority work is a candidate). The
victims are every job holding a GPU of the group (all their GPUs are freed). At most
``per_job`` candidates per job, in :func:`candidate_order`: candidates whose victims are
all NORMAL or LOW before those that cut a HIGH job (a CRITICAL job's preemption takes a
HIGH job, whose wait restarts with it, only when no lower-level work would do), then the
smallest weighted lost victim work (Σ w_v·(now − start_v)·GPUs_v, weight·GPU·s: a LOW job
that ran long is no cheaper a victim than a NORMAL job that just started), then the
smallest Σ victim weight, then group order. (Before 2026-12-03 the order was the smallest
lost work, unweighted: a HIGH job 4 s into its run went before a LOW job 34 s into its own;
bench/RESULTS.md, "HIGH's burst window, round 7".)
Whether a running job is preemptable at all (the per-job budget, the minimum runtime)
is the caller's ``RunningJob.preemptable`` (:func:`makespan.planner.preemption.victim_allowed`).

Transformation (:func:`apply`): the victims' GPUs free at ``now_s`` (a victim cut in its
transition leaves nothing resident); the victims become batch jobs (same id, release,
seq, deadline; restart from zero: full ``service_s``); the preemptor is committed on the
group at ``now_s`` (a :class:`RunningJob` that is not preemptable, ``free_at`` its end) so
nothing else, victims included, is placed there before it starts.

Score (:func:`decide`): with S(P) the evaluator's selection score of a plan of the rest
(:func:`makespan.planner.evaluator.score`, the policy's objective) and F(jobs) the objective of
jobs whose completion is fixed (:func:`fixed_score`), a candidate is taken when
    S(P_branch) + F(preemptor at C) < S(P_current) + F(victims at their original C)
i.e. both sides count the same jobs, and the work the victims already did is a cost
of its own: the left side adds :data:`LOST_WORK_WEIGHT` × Σ w_v·(now − start_v) (the
victims' time on their GPUs thrown away, weighted by their weight; weight·s). For ``weighted_tardiness`` policies F is
Σ w·max(0, C − d) + ε·Σ w·(C − r): a preemption that saves a deadline can win, one whose
victims' lateness costs more is refused. Greedy: per waiting CRITICAL/HIGH job (level,
then submission order; at most ``max_jobs`` jobs whose plan start is later than now),
the best improving candidate is accepted and the next job is tried on that branch.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from makespan.errors import PlannerError
from makespan.planner.evaluator_core import (TARDINESS_EPS, TOL_S, InfeasiblePlan, evaluate_without_preemptions,
                                             rescore, score)
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob, PlannedPreemption, RunningJob
from makespan.planner.preemption import may_preempt
from makespan.planner.replay import Replay

Group = tuple[str, ...]
Planner = Callable[[Sequence[PlanJob], FleetState], Plan]
PER_JOB = 2  # candidate groups scored per waiting job
MAX_JOBS = 3  # waiting CRITICAL/HIGH jobs tried per planning point
MIN_GAIN = 1e-6  # weight·s: a candidate must improve the score by more than this
LOST_WORK_WEIGHT = 1.0  # cost per victim weight·s of work already done (thrown away by the preemption)


@dataclass(frozen=True)
class Candidate:
    """A possible preemption: ``job`` takes ``group``, cutting ``victims`` (running jobs)."""

    job: PlanJob
    group: Group
    victims: tuple[RunningJob, ...]
    lost_gpu_s: float


def lost_work_cost(c: Candidate, now_s: float) -> float:
    """The cost of the work ``c``'s victims already did by ``now_s`` (module doc,
    "Score"), weight·s: :data:`LOST_WORK_WEIGHT` × Σ w_v·(now − start_v)."""
    return LOST_WORK_WEIGHT * sum(v.weight * max(0.0, now_s - v.start_s) for v in c.victims)


def fixed_score(done: Sequence[tuple[PlanJob, float]], objective: str) -> float:
    """The objective of jobs with fixed completions ``(job, C)`` as the evaluator's
    score counts it (weight·s): Σ w(C − r), or for ``weighted_tardiness``
    Σ w·max(0, C − d) + ε·Σ w(C − r)."""
    wc = sum(j.weight * (c - j.release_s) for j, c in done)
    if objective == "weighted_completion":
        return wc
    if objective == "weighted_tardiness":
        tardy = sum(j.weight * (c - j.deadline_s) for j, c in done if j.deadline_s is not None and c > j.deadline_s)
        return tardy + TARDINESS_EPS * wc
    raise PlannerError(f"unknown objective {objective!r}")


def _deps_done(job: PlanJob, state: FleetState, batch_ids: set[str]) -> bool:
    now = state.now_s
    return all(d not in batch_ids and (d in state.done or state.end_of.get(d, now) <= now + TOL_S) for d in job.deps)


def candidates(job: PlanJob, state: FleetState, batch: Sequence[PlanJob], per_job: int = PER_JOB) -> list[Candidate]:
    """The candidate preemptions for ``job`` on ``state`` (module doc), cheapest first;
    [] when it is not CRITICAL/HIGH, cannot start now, or could start on a free group now."""
    now = state.now_s
    ep = state.endpoints.get(job.endpoint)
    if job.priority > 1 or ep is None or not state.running or job.release_s > now + TOL_S:
        return []
    ids = {j.id for j in batch}
    if not _deps_done(job, state, ids):
        return []
    groups = state.groups(ep.tp, ep.memory_mib) if not job.narrowed else Replay(state).job_groups(job)
    if any(all(state.free_at.get(u, now) <= now + TOL_S for u in g) for g in groups):
        return []
    needed = {d for j in batch for d in j.deps}
    out: list[tuple[tuple[int, float, float, int], Candidate]] = []
    for i, g in enumerate(groups):
        hs = [state.running.get(u) for u in g if state.free_at.get(u, now) > now + TOL_S]  # free GPUs: no victim
        if not hs or any(h is None or not _victim_ok(h, job, state, needed) for h in hs):
            continue
        victims = {h.id: h for h in hs if h is not None}
        vs = tuple(victims[v] for v in sorted(victims))
        c = Candidate(job, g, vs, sum((now - v.start_s) * len(v.gpus) for v in vs))
        out.append((candidate_order(c, now, i), c))
    out.sort(key=lambda c: c[0])
    return [c[1] for c in out[:per_job]]


def candidate_order(c: Candidate, now_s: float, group_index: int = 0) -> tuple[int, float, float, int]:
    """The sort key of a candidate (module doc, "Candidates"): 1 when it cuts a HIGH (or
    CRITICAL) job, else 0; Σ w_v·(now − start_v)·GPUs_v (weight·GPU·s); Σ w_v; the group's
    index in the job's group list."""
    return (int(any(v.priority <= 1 for v in c.victims)),
            sum(v.weight * (now_s - v.start_s) * len(v.gpus) for v in c.victims),
            sum(v.weight for v in c.victims), group_index)


def _victim_ok(h: RunningJob, job: PlanJob, state: FleetState, needed: set[str]) -> bool:
    now = state.now_s
    return (h.preemptable and may_preempt(job.priority, h.priority) and h.start_s <= now + TOL_S
            and h.end_s > now + TOL_S and h.id not in needed
            and all(state.free_at.get(u, now) <= h.end_s + TOL_S for u in h.gpus))


def apply(state: FleetState, batch: Sequence[PlanJob], cand: Candidate) -> tuple[FleetState, list[PlanJob], Assignment]:
    """The state and batch after ``cand`` (module doc, "Transformation"), and the
    preemptor's assignment (start ``now_s`` on the group). ``state`` is not changed."""
    now = state.now_s
    free_at, resident = dict(state.free_at), dict(state.resident)
    running = dict(state.running)
    for v in cand.victims:
        for u in v.gpus:
            free_at[u] = now
            running.pop(u, None)
            if now < v.service_start_s - TOL_S:  # cut in its transition: its load was abandoned
                resident[u] = None
    mid = FleetState(now, state.gpus, state.endpoints, free_at=free_at, resident=resident,
                     set_point=state.set_point, done=state.done, end_of=state.end_of, asleep=state.asleep,
                     demand=state.demand, demand_share=state.demand_share, set_point_weight=state.set_point_weight,
                     host_ram_mib=state.host_ram_mib, asleep_level=state.asleep_level, upcoming=state.upcoming,
                     transition_rule=state.transition_rule)
    rep = Replay(mid)
    a = rep.place(cand.job, cand.group, now)
    for u in cand.group:
        running[u] = RunningJob(cand.job, cand.group, a.start_s, a.service_start_s, a.end_s, False)
    out = FleetState(now, state.gpus, state.endpoints, free_at=rep.free_at, resident=rep.resident,
                     set_point=state.set_point, done=state.done, end_of=ChainMap({cand.job.id: a.end_s}, state.end_of),
                     asleep=rep.asleep, demand=state.demand, demand_share=state.demand_share, running=running,
                     set_point_weight=state.set_point_weight, host_ram_mib=state.host_ram_mib,
                     asleep_level=dict(rep.level), upcoming=state.upcoming, transition_rule=state.transition_rule)
    rest = [j for j in batch if j.id != cand.job.id] + [v.job for v in cand.victims]
    return out, rest, a


@dataclass
class Branch:
    """The state, batch and plan of the rest after the preemptions taken so far.

    ``plan`` is the floor's plan of ``batch`` on ``state``, or None when no waiting job
    had a candidate (then nothing was planned: the caller plans as without preemption)."""

    state: FleetState
    batch: list[PlanJob]
    plan: Plan | None
    taken: list[PlannedPreemption]
    starts: list[Assignment]  # the preemptors' assignments
    preemptors: list[PlanJob]


def decide(batch: Sequence[PlanJob], state: FleetState, floor: Planner, objective: str,
           per_job: int = PER_JOB, max_jobs: int = MAX_JOBS) -> Branch:
    """Greedy scored preemption (module doc) with ``floor`` planning every branch.

    Returns the chosen branch; ``taken`` is empty when no candidate improves the score.
    Cost: nothing is planned unless some CRITICAL/HIGH job of the batch has a candidate;
    then 1 + (candidates scored, at most ``max_jobs × per_job``) floor plans."""
    cur = Branch(state, list(batch), None, [], [], [])
    if not state.running or not any(j.priority <= 1 and candidates(j, state, batch, 1) for j in batch):
        return cur
    cur.plan = floor(batch, state)
    now = state.now_s
    start = {a.job_id: a.start_s for a in cur.plan.assignments}
    waiting = sorted((j for j in batch if j.priority <= 1 and start.get(j.id, now) > now + TOL_S),
                     key=lambda j: (j.priority, j.seq))
    for job in waiting[:max_jobs]:
        best: tuple[float, Branch] | None = None
        s_cur = score(cur.plan)
        for c in candidates(job, cur.state, cur.batch, per_job):
            st, rest, a = apply(cur.state, cur.batch, c)
            p = floor(rest, st)
            gain = (s_cur + fixed_score([(v.job, v.end_s) for v in c.victims], objective)
                    - score(p) - fixed_score([(job, a.end_s)], objective) - lost_work_cost(c, now))
            if gain > MIN_GAIN and (best is None or gain > best[0]):
                pp = PlannedPreemption(job.id, tuple(v.id for v in c.victims), c.group, now, gain)
                best = (gain, Branch(st, rest, p, cur.taken + [pp], cur.starts + [a], cur.preemptors + [job]))
        if best is not None:
            cur = best[1]
    return cur


def assemble(rest: Plan, branch: Branch, objective: str) -> Plan:
    """The plan of the whole decision: the preemptors' assignments, then ``rest`` (the
    policy's plan of ``branch.batch`` on ``branch.state``, evaluated), with
    ``preemptions``; ``objective`` and ``stats['score']`` count the preemptors too
    (``stats['preemption_gain']``: Σ of the accepted gains, weight·s)."""
    if not branch.taken:
        return rest
    out = _with_fixed(rest, list(branch.starts), branch.preemptors, objective)
    out.preemptions = list(branch.taken)
    out.stats["preemption_gain"] = sum(p.gain for p in branch.taken)
    return out


def _with_fixed(rest: Plan, starts: list[Assignment], jobs: Sequence[PlanJob], objective: str) -> Plan:
    """``rest`` with the fixed assignments ``starts`` (of ``jobs``) put first and counted."""
    by_id = {j.id: j for j in jobs}
    done = [(by_id[a.job_id], a.end_s) for a in starts]
    st = dict(rest.stats)
    st["weighted_completion"] = st.get("weighted_completion", 0.0) + sum(j.weight * (c - j.release_s) for j, c in done)
    st["weighted_tardiness"] = st.get("weighted_tardiness", 0.0) + sum(
        j.weight * (c - j.deadline_s) for j, c in done if j.deadline_s is not None and c > j.deadline_s)
    st.setdefault("future_cost", 0.0)
    return rescore(Plan(rest.policy, starts + list(rest.assignments), 0.0, st, restores=list(rest.restores)), objective)


def evaluate_preemptive(plan: Plan, batch: Sequence[PlanJob], state: FleetState,
                        objective: str = "weighted_completion", *, policy: str | None = None,
                        check_times: bool = True) -> Plan:
    """Replay a plan with ``preemptions`` on ``state`` and score it on all its jobs.

    The preemptions apply in order (:func:`apply`; each must be a candidate of the
    module's rules on the state so far, its victims exactly the group's holders); the
    preemptors' assignments must start at ``now_s`` on their groups (with
    ``check_times``, their stated transition and completion must equal the replay's), and the other
    assignments are evaluated (:func:`makespan.planner.evaluator.evaluate`) on the transformed
    state for the batch less the preemptors plus the victims (``policy``, ``check_times``:
    as there). A plan without preemptions is evaluated as is.

    Returns:
        a new plan (preemptors first, then the rest in start order) whose ``objective`` /
        ``stats['score']`` count every job it places, preemptors included.

    Raises:
        InfeasiblePlan: a preemption breaks the rules, or an assignment is infeasible.
    """
    if not plan.preemptions:
        return evaluate_without_preemptions(plan, batch, state, policy, check_times, objective)
    branch, ev = split(plan, batch, state, objective, policy=policy, check_times=check_times)
    out = _with_fixed(ev, branch.starts, batch, objective)
    out.preemptions = branch.taken
    return out


def split(plan: Plan, batch: Sequence[PlanJob], state: FleetState, objective: str = "weighted_completion", *,
          policy: str | None = None, check_times: bool = True) -> tuple[Branch, Plan]:
    """(branch, rest) of a plan with ``preemptions``: the branch after applying them in
    order (checked as :func:`evaluate_preemptive` says; ``plan`` None) and the other
    assignments evaluated on its state for its batch. Raises InfeasiblePlan as there."""
    by_job = {a.job_id: a for a in plan.assignments}
    st, rest = state, list(batch)
    starts: list[Assignment] = []
    taken: list[PlannedPreemption] = []
    preemptors: list[PlanJob] = []
    for pp in plan.preemptions:
        job = next((j for j in rest if j.id == pp.job_id), None)
        if job is None:
            raise InfeasiblePlan(pp.job_id, "preemptor not in the batch")
        cand = next((c for c in candidates(job, st, rest, per_job=10 ** 6) if c.group == tuple(pp.gpus)), None)
        if cand is None or tuple(v.id for v in cand.victims) != tuple(pp.victims):
            raise InfeasiblePlan(pp.job_id, f"preemption of {pp.victims} on {pp.gpus} breaks the preemption rules")
        st, rest, a = apply(st, rest, cand)
        got = by_job.get(pp.job_id)
        if got is None or tuple(got.gpus) != a.gpus or abs(got.start_s - a.start_s) > TOL_S:
            raise InfeasiblePlan(pp.job_id, "preemptor's assignment is not its group at now")
        if check_times and (abs(got.service_start_s - a.service_start_s) > TOL_S or abs(got.end_s - a.end_s) > TOL_S
                            or got.load != a.load or tuple(got.evicts) != tuple(a.evicts)):
            raise InfeasiblePlan(pp.job_id, f"stated preemptor {got.service_start_s, got.end_s, got.load, got.evicts} "
                                            f"differs from the replay {a.service_start_s, a.end_s, a.load, a.evicts}")
        starts.append(a)
        taken.append(pp)
        preemptors.append(job)
    pre = {a.job_id for a in starts}
    ev = evaluate_without_preemptions(Plan(plan.policy, [a for a in plan.assignments if a.job_id not in pre], restores=list(plan.restores)),
                  rest, st, policy or plan.policy, check_times, objective)
    return Branch(st, rest, None, taken, starts, preemptors), ev


def chain(first: Branch, then: Branch) -> Branch:
    """``then`` (decided on ``first``'s state and batch) after ``first``: one branch."""
    return Branch(then.state, then.batch, None, first.taken + then.taken, first.starts + then.starts,
                  first.preemptors + then.preemptors)
