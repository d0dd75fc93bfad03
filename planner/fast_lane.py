"""No class worse off than under strict priority: the fast lane, pure.

``fifo`` (strict priority: level, then submission; the earliest-free group) is the baseline
a top-class user compares with. The policies trade waits between jobs to lower Σ w(C − r),
and that trade can push a CRITICAL job behind work it would have gone before under strict
priority (issue 19 point 4: the p95 wait of CRITICAL was 3.0× fifo's on some trace windows).

The lane's levels (default :data:`DEFAULT_LANE_LEVELS`, CRITICAL only), each with a factor f
≥ 1 (1 unless given), are planned as strict priority would plan them on the same state: the
lane jobs whose dependencies are done, in (level, release, submission) order, each after the
work running and the lane jobs before it, on the group where it starts first (``fifo``'s
rule, paying any load): that gives its strict-priority completion C*. Its **allowed
completion** is r + f·(C* − r) (release r: its response time at most f × the strict-priority
one). Its lane placement is the group where it completes first (a warm group that frees a
little later beats a cold one free now: it completes earlier, and a plan that waits for it
is not late).

:func:`enforce` checks the policy's plan: when every lane job completes by its allowed
completion, the plan is returned unchanged. Otherwise it is rebuilt as a list schedule on a
:class:`makespan.planner.replay.Replay` of the state: the late lane jobs first (the
**forced** set, in lane order, each on the group where it completes first), then every other
job of the plan in the plan's start order on its planned group at its earliest time there
(the policy's groups, its order and so its transitions are kept; a job only moves behind a
forced job that now takes its GPUs first). A lane job that the rebuild makes late joins the
forced set and the rebuild is repeated (at most once per lane job: with every lane job
forced, the placements are the lane's, and none is late). The other lane jobs keep the
policy's order among themselves (a short CRITICAL job before a long one) as long as each
completes in time. A second candidate, when the caller gives a ``replan`` policy
(:func:`makespan.planner.api.plan` gives the greedy floor, ``portfolio``, or the policy
itself for the fixed baselines; the live worker the same), is the forced placements plus
that policy's plan of the other jobs on the state they leave; it is kept when its score is
lower and no lane job is late in it. The result is evaluated
(:func:`makespan.planner.evaluator.evaluate`): a feasible plan of the same batch.

The guarantee: at every planning point, no lane job is planned to complete later than its
allowed completion (f = 1: later than strict priority would complete it from that state).
The bench target is on waits (issue 19 point 4: p95 wait of CRITICAL ≤ 1.1× fifo's, HIGH ≤
1.25×, bench/RESULTS.md); the lane bounds the response time, which does not let a plan wait
longer for a warm GPU than the cold start it saves; on the bench's windows the wait targets
are not met (CRITICAL worst window 1.92×, bench/RESULTS.md), a lane bounding the start
met CRITICAL's but cost the weighted-completion target. A plan with preemptions is returned as
is (the preemptors start at once; the rest of such a plan is checked by the caller on the
state the preemptions leave, :func:`makespan.planner.api.plan`). The lane comes after the
aging reservation (:mod:`makespan.planner.reservation`): a CRITICAL job goes before a
reserved lower-level job, as a CRITICAL preemption does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from makespan.planner.evaluator import TOL_S, evaluate_retimed, score
from makespan.planner.helpers import helpers_start_s
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Replay, state_after

Replan = Callable[[Sequence[PlanJob], FleetState], Plan]
Levels = Sequence[int] | Mapping[int, float]  # levels, or level -> factor (a sequence: factor 1)

DEFAULT_LANE_LEVELS: tuple[int, ...] = (0,)  # CRITICAL (Settings.fast_lane)


def factors(levels: Levels) -> dict[int, float]:
    """``levels`` as level -> factor (a plain sequence of levels: factor 1 each)."""
    return dict(levels) if isinstance(levels, Mapping) else {int(x): 1.0 for x in levels}


def lane_plan(batch: Sequence[PlanJob], state: FleetState,
              levels: Levels) -> tuple[Replay, list[Assignment], dict[str, float]]:
    """The lane jobs of ``batch`` placed as the lane places them (module doc): the replay
    after them, their assignments ([] when the batch has none) and each one's latest
    allowed completion, workload s."""
    ids = {j.id for j in batch}
    now = state.now_s
    fac = factors(levels)
    lane = sorted((j for j in batch if j.priority in fac
                   and all(d not in ids and state.end_of.get(d, now) <= now + TOL_S for d in j.deps)),
                  key=lambda j: (j.priority, j.release_s, j.seq))
    rep = Replay(state)
    out: list[Assignment] = []
    allowed: dict[str, float] = {}
    for j in lane:
        ep = state.endpoints.get(j.endpoint)
        if ep is None or not rep.job_groups(j):
            continue
        g_strict, g_best = _groups(rep, j)
        r = rep.ready(j)
        strict_end = max(r, rep.group_free(g_strict)) + rep.transition_s(g_strict, ep) + j.service_s
        if j.helpers:
            strict_end += helpers_start_s(j.helpers, rep.endpoints)
        allowed[j.id] = j.release_s + fac[j.priority] * (strict_end - j.release_s)
        out.append(rep.place(j, g_best))
    return rep, out, allowed


def _groups(rep: Replay, j: PlanJob) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(strict priority's group: earliest start, ties: shortest transition, then group
    order; the lane's group: earliest completion, ties: earliest start) of ``j`` on ``rep``."""
    ep = rep.endpoints[j.endpoint]
    r = rep.ready(j)
    cand = [(max(r, rep.group_free(g)), rep.transition_s(g, ep), i, g) for i, g in enumerate(rep.job_groups(j))]
    strict = min(cand, key=lambda c: (c[0], c[1], c[2]))[3]
    best = min(cand, key=lambda c: (c[0] + c[1], c[0], c[2]))[3]
    return strict, best


def enforce(p: Plan, batch: Sequence[PlanJob], state: FleetState, levels: Levels = DEFAULT_LANE_LEVELS,
            slack_s: float = 0.0, objective: str = "weighted_completion",
            replan: Replan | None = None) -> tuple[Plan, int]:
    """``p`` with no lane job completing after its allowed completion + ``slack_s`` (module
    doc), and how many lane jobs ``p`` had completing later (0: ``p`` returned unchanged).
    ``p`` must be a plan of ``batch`` on ``state``; one with preemptions is returned as is.
    The rebuilt plan has no restores (plan them after) and is scored with ``objective``.

    ``levels``: the lane's levels, or level -> factor f ≥ 1 (module doc: a lane job is
    late when its planned completion is past release + f × (strict-priority completion −
    release); f = 1 for a plain sequence); a late plan is rebuilt with the late lane jobs
    forced first (module doc; ``stats['fast_lane_forced']``: how many).

    ``replan(jobs, state)``: a policy (without preemption) that plans the jobs not forced on
    the state the forced placements leave (:func:`makespan.planner.replay.state_after`);
    when given, the forced placements plus its plan compete with the rebuilt list schedule
    and the lower score is kept if no lane job is late in it
    (``stats['fast_lane_replanned']`` = 1 when the replan won).

    Returns ``(plan, late)``; ``plan.stats['fast_lane_late']`` = ``late`` when rebuilt."""
    if not levels or not batch or p.preemptions:
        return p, 0
    _rep, lane, allowed = lane_plan(batch, state, levels)
    if not lane:
        return p, 0
    jobs = {j.id: j for j in batch}
    lim = {jid: t + slack_s + TOL_S for jid, t in allowed.items()}

    def late_in(q: Plan) -> set[str]:
        mine = q.by_job()
        return {a.job_id for a in lane if a.job_id not in mine or mine[a.job_id].end_s > lim[a.job_id]}
    late = late_in(p)
    if not late:
        return p, 0
    n_late = len(late)
    forced: set[str] = set()
    ev = p
    for _ in range(len(lane)):  # force the late lane jobs first; repeat while the rebuild makes others late
        forced |= late
        rep, first = _forced(lane, forced, jobs, state, allowed)
        out = list(first)
        for a in sorted(p.assignments, key=lambda a: (a.start_s, a.end_s)):
            if a.job_id not in forced:
                out.append(rep.place(jobs[a.job_id], tuple(a.gpus)))
        rebuilt = evaluate_retimed(out, batch, state, p.policy, objective)
        if rebuilt is None:  # no consistent rebuild (evaluate_retimed): the policy's plan, feasible, stands
            p.stats["fast_lane_late"] = float(n_late)
            p.stats["fast_lane_unrebuilt"] = 1.0
            return p, n_late
        ev = rebuilt
        late = late_in(ev)
        if not late:
            break
    rest = [j for j in batch if j.id not in forced]
    if replan is not None and rest and not late:
        q = replan(rest, state_after(state, jobs, first, forced))
        if not q.preemptions:
            alt = evaluate_retimed(list(first) + list(q.assignments), batch, state, p.policy, objective)
            if alt is not None and score(alt) < score(ev) and not late_in(alt):
                alt.stats["fast_lane_replanned"] = 1.0
                ev = alt
    ev.stats["fast_lane_late"] = float(n_late)
    ev.stats["fast_lane_forced"] = float(len(forced))
    return ev, n_late


def _forced(lane: list[Assignment], forced: set[str], jobs: dict[str, PlanJob], state: FleetState,
            allowed: dict[str, float]) -> tuple[Replay, list[Assignment]]:
    """The ``forced`` lane jobs alone, in lane order, each on the group where it completes
    first: the replay after them and their assignments (each completes by its allowed
    completion: no more lane jobs are ahead of it than in :func:`lane_plan`)."""
    rep = Replay(state)
    out = []
    for a in lane:
        if a.job_id in forced:
            j = jobs[a.job_id]
            out.append(rep.place(j, _groups(rep, j)[1]))
    return rep, out
