"""Policies ``tardiness`` and ``tardiness-portfolio``: weighted tardiness on the whole fleet.

Objective: Σ_j w_j·max(0, C_j − d_j) over the jobs with a deadline d_j (``PlanJob.deadline_s``,
absolute, s); score = that + ε·(Σ_j w_j (C_j − r_j) + future cost), ε = 1e-6
(:data:`makespan.planner.evaluator.TARDINESS_EPS`; jobs without a deadline count only in that
tie-break). Scored by :func:`makespan.planner.evaluator.evaluate` with
``objective="weighted_tardiness"`` on the same exact replay as every policy (transitions,
gangs on aligned TP groups, memory, precedence). ``Plan.objective`` is the pure weighted
tardiness, weight·s; ``stats`` also carry ``weighted_completion``.

Greedy members (list scheduling through :class:`makespan.planner.replay.Replay`, each evaluated):
    * ``edd``: earliest due date first (jobs without a deadline last, WSPT on area among
      them), each on the group completing it earliest; ``ta-edd`` / ``ta-edd-nopull``:
      the same order with the transition-aware group rule (:func:`makespan.planner.rules.aware_rule`:
      prefers groups already holding the model), with / without pull-forward;
      ``partition-edd`` / ``partition-spill-edd``: residency per endpoint first
      (:mod:`makespan.planner.partition`), EDD inside;
    * ``atc-k`` for k in :data:`ATC_K`: Apparent Tardiness Cost list scheduling
      (Vepsalainen & Morton 1987) with the setup factor of ATCS (Lee, Bhaskaran & Pinedo
      1997). At t = max(now, earliest time a GPU is free), among the jobs ready by t (none:
      those ready earliest) the job with the largest
          I_j = w_j / (p_j·tp_j) · exp(−max(d_j − p_j − s_j − max(t, ready_j), 0) / (k·p̄))
                · exp(−s_j / (k·s̄))
      goes next (ties: larger w_j/(p_j·tp_j), then submission), on the group chosen by the
      transition-aware rule; s_j = 0 when a whole instance of its endpoint is resident,
      else its cold start; p̄ = mean service time, s̄ = mean cold start of the batch's
      endpoints; jobs without a deadline have I_j = 0 (so WSPT orders them, after the rest);
    * every member of :func:`makespan.planner.greedy.members` (baselines and portfolio), rescored.
``tardiness-portfolio`` returns the best score (the floor): the plan that scoring every
member (:func:`tardiness_members`) would select, built in :data:`BUILD_ORDER` with each
construction stopped once a lower bound on its score exceeds the best so far
(:class:`makespan.planner.list_schedule.TardinessPrune`), members scored from the replay that built
them (:func:`makespan.planner.evaluator.evaluate_built`), the winner replayed by
:func:`makespan.planner.evaluator.evaluate`.

``tardiness`` = floor, then within ``time_limit_s`` (never worse than the floor):
    * ≤ :data:`makespan.planner.exact.MAX_EXACT_JOBS` jobs: exact branch and bound on this objective;
    * a floor with zero weighted tardiness is returned as is (tardiness-optimal; the
      tie-break is not searched further);
    * else order local search for half the budget: the incumbent's jobs in start order,
      decoded by transition-aware list scheduling and scored by the evaluator; a move takes
      a tardy job (seeded choice) and swaps it with, or inserts it before, an earlier job;
      improving moves are kept; after ``4·n`` failed moves the best order is perturbed by
      2–4 random swaps (iterated local search, Lourenço, Martin & Stützle 2003); at most
      ``max_evals`` decodes. Then the CP-SAT windowed LNS (:func:`makespan.planner.cpsat.improve`)
      with the tardiness objective for the rest of the budget.
Deterministic for a seed when ``max_evals`` (not the wall time) ends the local search
and the LNS gets the same windows (one CP-SAT worker): pass a
:class:`makespan.planner.cpsat.SearchEffort` (``effort``) to bound the search by work
only, the time limit then a backstop (the order search may use all of it).
"""

from __future__ import annotations

import math
import random
import time
from bisect import insort
from collections.abc import Collection, Sequence
from functools import partial
from heapq import heappop, heappush

from makespan.planner.cpsat import SearchEffort, improve
from makespan.planner.evaluator import evaluate, evaluate_built, rescore, score
from makespan.planner.exact import MAX_EXACT_JOBS, exact
from makespan.planner.greedy import MEMBERS as GREEDY_MEMBERS
from makespan.planner.greedy import Builder, construct, construct_built, member_builders
from makespan.planner.list_schedule import pruner, topo_stable
from makespan.planner.model import Assignment, EndpointModel, FleetState, Plan, PlanJob
from makespan.planner.partition import partition_built
from makespan.planner.previous import start_plan
from makespan.planner.replay import Replay
from makespan.planner.rules import aware_rule

OBJ = "weighted_tardiness"
ATC_K = (0.5, 1.0, 2.0)  # 0.25 as well: cluster09 seed 1 54.4k → 61.8k weight·s in the benchmark
MEMBERS = ("edd", "ta-edd", "ta-edd-nopull", "partition-edd", "partition-spill-edd") + \
    tuple(f"atc-{k:g}" for k in ATC_K)
# Order in which :func:`tardiness_portfolio` builds the members (the most frequent winners
# on the identity instances of the speed-up first, so that their score prunes the others
# early); the choice does not depend on it.
BUILD_ORDER = ("atc-0.5", "edd", "atc-1", "atc-2", "partition-edd", "partition-spill-edd", "ta-edd-nopull",
               "cap-share", "ta-share", "cap-aware", "ta-fifo", "ta-edd", "min-evict", "wspt", "partition",
               "partition-spill", "ta-wspt")


def edd_order(jobs: Sequence[PlanJob], endpoints: dict[str, EndpointModel]) -> list[PlanJob]:
    """Ascending deadline, then jobs without one by WSPT on area (p_j·tp_j / w_j); ties by
    submission; dependencies before dependants."""
    def key(j: PlanJob) -> tuple[float, float, int]:
        wspt = j.service_s * endpoints[j.endpoint].tp / j.weight
        return (j.deadline_s, wspt, j.seq) if j.deadline_s is not None else (math.inf, wspt, j.seq)
    return topo_stable(sorted(jobs, key=key))


def atc_construct(batch: Sequence[PlanJob], state: FleetState, k: float) -> list[Assignment]:
    """ATC/ATCS list scheduling (module doc) with look-ahead ``k``; every job placed once."""
    return atc_built(batch, state, k)[0]  # type: ignore[index]  # never None without a bound


def atc_built(batch: Sequence[PlanJob], state: FleetState, k: float,
              bound: float = math.inf) -> tuple[list[Assignment], Replay] | None:
    """:func:`atc_construct`, also returning the :class:`Replay` that placed the assignments
    (for :func:`makespan.planner.evaluator.evaluate_built`); None as soon as the plan provably
    scores above ``bound`` (:class:`makespan.planner.list_schedule.TardinessPrune`).

    Incremental, with the choice of recomputing every index at every step: a job's ready
    time is fixed once its in-batch dependencies are placed (it is computed then); the
    available jobs are kept in two lists, with and without a deadline, each by descending
    w_j/(p_j·tp_j), then submission, then batch position. Without a deadline the first
    candidate of its list has the largest index (0, w_j/(p_j·tp_j), −seq); with one, the
    scan stops at the first job whose w_j/(p_j·tp_j) is below the best index so far (an
    index never exceeds it: the exponential factors are ≤ 1). Equal indices go to the job
    earlier in the batch, as ``max`` over the batch order does."""
    rep = Replay(state)
    rule = aware_rule(batch, state)
    eps = state.endpoints
    jobs = list(batch)
    n = len(jobs)
    ids = {j.id: i for i, j in enumerate(jobs)}
    pbar = max(sum(j.service_s for j in jobs) / n, 1e-9)
    sbar = max(sum(eps[e].cold_start_s for e in {j.endpoint for j in jobs}) / len({j.endpoint for j in jobs}), 1e-9)
    kp, ks = k * pbar, k * sbar
    base = [j.weight / max(j.service_s * eps[j.endpoint].tp, 1e-9) for j in jobs]
    ready = [0.0] * n
    waiting = [0] * n  # in-batch dependencies not placed yet
    dependants: dict[int, list[int]] = {}
    for i, j in enumerate(jobs):
        for d in {ids[d] for d in j.deps if d in ids}:
            waiting[i] += 1
            dependants.setdefault(d, []).append(i)
    due: list[int] = []  # available jobs with a deadline, by (−base, seq, batch position)
    nodue: list[int] = []  # and without one
    heap: list[tuple[float, int]] = []  # (ready, position) of available jobs; placed ones popped lazily
    placed = [False] * n

    def release(i: int) -> None:
        ready[i] = rep.ready(jobs[i])
        insort(due if jobs[i].deadline_s is not None else nodue, i, key=lambda x: (-base[x], jobs[x].seq, x))
        heappush(heap, (ready[i], i))

    for i in range(n):
        if not waiting[i]:
            release(i)
    out: list[Assignment] = []
    fa, now = rep.free_at, state.now_s
    prune = pruner(jobs, state, bound, fa, OBJ)
    while heap:
        t = max(now, min(fa.values()))
        while placed[heap[0][1]]:
            heappop(heap)
            if not heap:
                break
        if not heap:
            break
        lim = t if heap[0][0] <= t else heap[0][0]  # candidates: ready by t, else the earliest ready
        held: dict[str, bool] = {}
        best: tuple[float, float, int, int] | None = None
        at, src = -1, nodue
        for x, i in enumerate(nodue):
            if ready[i] <= lim:
                best, at = (0.0, base[i], -jobs[i].seq, -i), x
                break
        for x, i in enumerate(due):
            if ready[i] > lim:
                continue
            b = base[i]
            if best is not None and b < best[0]:
                break
            j = jobs[i]
            ep = eps[j.endpoint]
            h = held.get(j.endpoint)
            if h is None:
                h = held[j.endpoint] = rep.whole_gpus(j.endpoint) >= ep.tp
            s = 0.0 if h else ep.cold_start_s
            r = ready[i]
            slack = j.deadline_s - j.service_s - s - (r if r > t else t)  # type: ignore[operator]
            if 0.0 > slack:  # max(slack, 0.0) and max(t, r) above, without the calls
                slack = 0.0
            v = b * math.exp(-slack / kp - s / ks)
            if best is not None and v < best[0]:
                continue
            key = (v, b, -j.seq, -i)
            if best is None or key > best:
                best, at, src = key, x, due
        i = src.pop(at)
        job = jobs[i]
        g = rule(rep, job, rep.job_groups(job), ready[i])
        a = rep.place(job, g)
        if prune is not None and not prune.placed(job, a.gpus, a.end_s):
            return None
        out.append(a)
        rule.placed(job)
        placed[i] = True
        for d in dependants.get(i, ()):
            waiting[d] -= 1
            if not waiting[d]:
                release(d)
    if len(out) < n:
        raise ValueError(f"dependency cycle among {[j.id for j, p in zip(jobs, placed) if not p][:5]}")
    return out, rep


def _builders(batch: Sequence[PlanJob], state: FleetState) -> dict[str, Builder]:
    """Member name -> its construction given a score bound (``bound=``): (assignments, the
    replay that placed them), None when pruned or skipped; in listing order (:data:`MEMBERS`,
    then the weighted-completion members in :data:`makespan.planner.greedy.MEMBERS` order)."""
    edd = edd_order(batch, state.endpoints)
    out: dict[str, Builder] = {n: partial(construct_built, edd, state, r, p, objective=OBJ) for n, r, p in
                               (("edd", "completion", False), ("ta-edd", "aware", True),
                                ("ta-edd-nopull", "aware", False))}
    for name, spill in (("partition-edd", False), ("partition-spill-edd", True)):
        out[name] = partial(partition_built, batch, state, spill, order=edd, objective=OBJ)
    for k in ATC_K:
        out[f"atc-{k:g}"] = partial(atc_built, batch, state, k)
    wc = member_builders(batch, state, OBJ)
    return out | {n: wc[n] for n in GREEDY_MEMBERS if n in wc}


def tardiness_members(batch: Sequence[PlanJob], state: FleetState) -> list[Plan]:
    """The members of the module doc, evaluated for weighted tardiness, in listing order
    (each scored from the replay that built it, :func:`makespan.planner.evaluator.evaluate_built`:
    the plan ``evaluate(..., check_times=False, objective=OBJ)`` gives)."""
    out = []
    for name, build in _builders(batch, state).items():
        built = build(bound=math.inf)
        if built is not None:
            out.append(rescore(evaluate_built(built[0], built[1], batch, state, name), OBJ))
    return out


def tardiness_portfolio(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    """Best-scored member (ties: first listed); ``stats['member']`` is the winner's index in
    :data:`MEMBERS`, or −1 for a rescored member of the weighted-completion portfolio. The
    same plan as the best of :func:`tardiness_members`, built in :data:`BUILD_ORDER` with
    each construction stopped once it provably scores above the best so far
    (:class:`makespan.planner.list_schedule.TardinessPrune`); the winner goes through the
    evaluator's own replay (:func:`makespan.planner.evaluator.evaluate`)."""
    builders = _builders(batch, state)
    listed = {n: i for i, n in enumerate(builders)}
    first = {n: i for i, n in enumerate(BUILD_ORDER)}
    best: Plan | None = None
    rank = (math.inf, len(listed))
    for name in sorted(builders, key=lambda n: first.get(n, len(first))):  # a member not listed: last
        built = builders[name](bound=rank[0])
        if built is None:
            continue
        p = rescore(evaluate_built(built[0], built[1], batch, state, name), OBJ)
        r = (score(p), listed[name])
        if r < rank:
            best, rank = p, r
    assert best is not None, "a construction without a bound always completes"
    out = evaluate(best.assignments, batch, state, "tardiness-portfolio", objective=OBJ)
    out.stats["member"] = float(MEMBERS.index(best.policy)) if best.policy in MEMBERS else -1.0
    return out


def _decode(order: Sequence[PlanJob], batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return evaluate(construct("ls", topo_stable(order), state, "aware"), batch, state, "tardiness",
                    check_times=False, objective=OBJ)


def order_search(batch: Sequence[PlanJob], state: FleetState, inc: Plan, deadline: float, seed: int = 0,
                 max_evals: int = 20_000) -> Plan:
    """Order local search of the module doc from ``inc``'s start order until the wall-clock
    ``deadline`` (``time.perf_counter()``) or ``max_evals`` decodes; the best plan by
    score, never worse than ``inc``."""
    jobs = {j.id: j for j in batch}
    rng = random.Random(seed)
    cur_order = [jobs[a.job_id] for a in inc.assignments]
    cur = _decode(cur_order, batch, state)
    best, best_order = (cur, cur_order) if score(cur) < score(inc) else (inc, cur_order)
    evals, fails, n = 1, 0, len(cur_order)
    while evals < max_evals and time.perf_counter() < deadline:
        end = {a.job_id: a.end_s for a in cur.assignments}
        tardy = [i for i, j in enumerate(cur_order) if i > 0 and j.deadline_s is not None and end[j.id] > j.deadline_s]
        if not tardy:
            break
        i = rng.choice(tardy)
        k = rng.randrange(i)
        cand = list(cur_order)
        if rng.random() < 0.5:
            cand[i], cand[k] = cand[k], cand[i]
        else:
            cand.insert(k, cand.pop(i))
        c = _decode(cand, batch, state)
        evals += 1
        if score(c) < score(cur) - 1e-9:
            cur, cur_order, fails = c, [jobs[a.job_id] for a in c.assignments], 0
            if score(cur) < score(best) - 1e-9:
                best, best_order = cur, cur_order
        else:
            fails += 1
        if fails > 4 * n and evals < max_evals:
            cand = list(best_order)
            for _ in range(rng.randint(2, 4)):
                x, y = rng.randrange(n), rng.randrange(n)
                cand[x], cand[y] = cand[y], cand[x]
            cur = _decode(cand, batch, state)
            cur_order, fails = [jobs[a.job_id] for a in cur.assignments], 0
            evals += 1
    out = Plan("tardiness", list(best.assignments), best.objective, dict(best.stats))
    out.stats["order_evals"] = float(evals)
    return out


def tardiness_policy(batch: Sequence[PlanJob], state: FleetState, time_limit_s: float = 1.0, seed: int = 0,
                     num_workers: int = 1, max_evals: int = 20_000, previous: Plan | None = None,
                     preemption: bool | Collection[str] = False, first_window_share: float = 0.25,
                     effort: SearchEffort | None = None) -> Plan:
    """Policy ``tardiness`` (module doc): floor, then exact / order search + LNS within
    ``time_limit_s`` s with ``num_workers`` CP-SAT workers (with ``effort``: bounded by
    ``max_evals`` and the effort, ``time_limit_s`` a backstop); the order search starts from
    ``previous`` repaired to the batch when that scores lower than the floor
    (:func:`makespan.planner.previous.start_plan`). ``stats``: ``floor_score``, ``previous_used``,
    ``floor_objective`` (the floor's weighted tardiness), and ``preemption`` as
    :func:`makespan.planner.cpsat.improve` (its windows may cut running jobs; ``first_window_share``
    as there),
    ``proven_optimal`` (1: exact search finished, or zero weighted tardiness — optimal in
    the tardiness term, not in the tie-break)."""
    t0 = time.perf_counter()
    floor = tardiness_portfolio(batch, state)
    fs = score(floor)
    if len(batch) <= MAX_EXACT_JOBS:
        out = exact(batch, state, floor, time_limit_s=time_limit_s, objective=OBJ)
        proven = out.stats["exact"]
    elif floor.objective <= 0.0:
        out, proven = Plan("tardiness", list(floor.assignments), floor.objective, dict(floor.stats)), 1.0
    else:
        start, _prev_score, prev_used = start_plan(floor, previous, batch, state, OBJ)
        order_deadline = t0 + (time_limit_s if effort is not None else time_limit_s / 2)
        out = order_search(batch, state, start, order_deadline, seed, max_evals)
        out.stats["previous_used"] = float(prev_used)
        ls_score, evals = score(out), out.stats["order_evals"]
        left = time_limit_s - (time.perf_counter() - t0)
        if left > 0.05 and out.objective > 0.0:
            out = improve(batch, state, out, time_limit_s=left, seed=seed, workers=num_workers, objective=OBJ,
                          preemption=preemption, first_window_share=first_window_share, effort=effort)
        proven = float(out.objective <= 0.0)
        out.stats.update({"order_search_score": ls_score, "order_evals": evals})
    out.policy = "tardiness"
    out.stats.update({"floor_score": fs, "floor_objective": floor.objective, "proven_optimal": proven})
    return out
