"""CP-SAT improver: local search and windowed large-neighbourhood search over the greedy plan.

Search (:func:`improve`), all within one wall-time limit: the start plan is the greedy
portfolio plan, or the previous planning point's plan repaired to this batch when that
scores lower (:mod:`makespan.planner.previous`); then first-improvement passes of swap/regroup
moves (:func:`makespan.planner.local.descent`) until a local optimum of that neighbourhood; then
sweeps of CP-SAT windows (the larger neighbourhood, to leave it), each followed by
descent to a local optimum again. A sweep solves every window of ``k`` consecutive jobs
of the incumbent (start order, half overlapping, seeded random order); ``k`` grows by 4
after a sweep that improved nothing. A window's solution is decoded into a whole plan (prefix as
is, window in the model's order and groups, suffix in its old order and groups, all
re-placed through the exact replay, :func:`makespan.planner.local.decode_window`) and accepted
only if :func:`makespan.planner.evaluator.evaluate` scores it lower, so the result is never worse
than the start plan. A solution whose model objective is not below the incumbent's is
not decoded.

The window model (its variables, constraints and objective) is
:mod:`makespan.planner.window_model`.

Limits. By default every step is bounded by wall time, which is what a live planner
needs (an answer within its budget) but makes the result depend on the machine's speed
and load. With a :class:`SearchEffort` the search is bounded by the work it does
instead — CP-SAT's deterministic time per model and a number of LNS windows — and the
wall time limit is only a backstop: for tests and benches that judge the quality of a
result (with one CP-SAT worker the result is then the same on a fast and on a loaded
host, as long as the backstop is not reached).
Running work is never moved: it lives in ``FleetState.free_at``; with ``preemption``,
windows that start at the plan's first job may also cut running jobs by the design's level
rules (:mod:`makespan.planner.window_preemption`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from makespan.errors import PlannerError
from makespan.planner.evaluator import InfeasiblePlan, evaluate, score
from makespan.planner import whole
from makespan.planner.exact import MAX_EXACT_JOBS, exact
from makespan.planner.greedy import portfolio
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.planner.local import decode_window, descent
from makespan.planner.previous import start_plan
from makespan.planner.preemption_plan import assemble
from makespan.planner import window_preemption as wp
from makespan.planner.replay import Replay
from makespan.planner.window_model import Window, solve_window


@dataclass(frozen=True)
class SearchEffort:
    """A search bounded by the work it does, not by wall time (module doc, "Limits").

    Attributes:
        deterministic_s: CP-SAT ``max_deterministic_time`` of each model solve (the
            whole-batch model, each LNS window), deterministic s (CP-SAT's measure of the
            work done, in units loosely like seconds of a fast core; the same under any
            load: the 30-job whole-batch proof takes 0.115 of them, bench/RESULTS.md).
        windows: the LNS solves at most this many windows (None: until its own end, a
            sweep of the largest windows that improved nothing).

    With an effort, the descent runs to its local optimum, the exact search to its node
    limit and the LNS windows to ``deterministic_s`` each; ``time_limit_s`` still ends
    every step (a backstop against a search that never ends, not a budget).
    """

    deterministic_s: float = 1.0
    windows: int | None = None


def _descend(best: Plan, batch: Sequence[PlanJob], state: FleetState, deadline: float,
             objective: str) -> tuple[Plan, int]:
    """Descent passes (:func:`makespan.planner.local.descent`) until one accepts no move (a local
    optimum of the swap/regroup neighbourhood) or the deadline; (plan, moves accepted)."""
    moves = 0
    while time.perf_counter() < deadline:
        best, acc = descent(best, batch, state, deadline, objective)
        moves += acc
        if not acc:
            break
    return best, moves


def _offsets(n: int, k: int, rng: random.Random) -> list[int]:
    """Window starts of one sweep: every ⌈k/2⌉ jobs and the last window, shuffled."""
    offs = sorted(set(range(0, max(1, n - k + 1), max(1, k // 2))) | {max(0, n - k)})
    rng.shuffle(offs)
    return offs


def improve(batch: Sequence[PlanJob], state: FleetState, greedy: Plan, time_limit_s: float = 1.0,
            seed: int = 0, workers: int = 1, window_jobs: int = 6, max_window_jobs: int = 16,
            max_groups: int = 4, verify_hint: bool = False, window_limit_s: float | None = None,
            previous: Plan | None = None, local: bool = True, windows_on: bool = True,
            objective: str = "weighted_completion", preemption: bool | Collection[str] = False,
            first_window_share: float = 0.25, effort: SearchEffort | None = None) -> Plan:
    """Local search and windowed LNS over ``greedy`` (an evaluated plan) for
    ``time_limit_s`` wall seconds (module doc), or, with ``effort``, for that work
    (:class:`SearchEffort`; ``time_limit_s`` is then a backstop and ``window_limit_s``
    is ignored).

    Windows of ``k`` jobs (from ``window_jobs``, growing by 4 up to ``max_window_jobs``)
    are solved for at most ``window_limit_s`` each (default: the limit ÷ 20, within
    0.02–0.25 s); the search ends at the time limit or after a sweep of the largest
    windows and the descent after it improved nothing. ``local``: descend with swap/regroup
    moves (:func:`makespan.planner.local.descent`, passes until one accepts nothing) first and
    after every sweep; ``windows_on`` False: the descent only (a comparison mode, no
    CP-SAT). ``previous``: a plan of an earlier planning point; repaired to this batch
    (:func:`makespan.planner.previous.repair`) and used as the start when it scores lower than
    ``greedy``.

    Returns the best evaluated plan (``policy`` "cpsat"; stats: windows, improved (accepted
    windows), local_moves (accepted descent moves), sweeps, window_jobs (the last size),
    greedy_score, previous_score (NaN without ``previous``), previous_used;
    windows_optimal = window solves CP-SAT proved optimal; first_window_optimal and
    first_window_objective = status (1/0) and model objective of the first window;
    windows_all_optimal = 1 when the search ended with a full sweep whose every window was
    proved optimal — a local optimum per window, not a proof for the whole batch, so
    proven_optimal is always 0 here). Never worse than ``greedy`` (nor than the repaired
    ``previous``) by score, for ``objective`` (:data:`makespan.planner.evaluator.OBJECTIVES`;
    ``greedy`` scored for it too).

    ``preemption`` (with ``state.running``; True, or the ids of the jobs that may preempt —
    the planning point's batch when ``batch`` already holds victims of an earlier
    decision): windows that start at the plan's first job
    also decide preemptions (:mod:`makespan.planner.window_preemption`); the first such window is
    solved before anything else, with ``first_window_share`` of the limit (default a
    quarter). A plan that took any is
    returned with ``preemptions`` (preemptors first, as
    :func:`makespan.planner.preemption_plan.assemble` builds it; ``stats['window_preemptions']``),
    to be evaluated with :func:`makespan.planner.preemption_plan.evaluate_preemptive`; never worse
    than ``greedy`` with the victims counted at their original completions."""
    deadline = time.perf_counter() + time_limit_s
    jobs = {j.id: j for j in batch}
    best, prev_score, prev_used = start_plan(greedy, previous, batch, state, objective)
    n = len(best.assignments)
    rng = random.Random(seed)
    per_window = window_limit_s if window_limit_s is not None else min(0.25, max(0.02, time_limit_s / 20))
    if effort is not None:
        per_window = time_limit_s  # the backstop: each window ends at its deterministic time
    window_deterministic_s = effort.deterministic_s if effort is not None else None
    max_windows = effort.windows if effort is not None and effort.windows is not None else math.inf
    windows = improved = optimal = sweeps = moves = 0
    sweep_better = sweep_optimal = sweep_windows = 0
    first: tuple[float, float] | None = None
    k = min(window_jobs, n)
    offsets = _offsets(n, k, rng)
    all_optimal = False
    taken: list[wp.Taken] = []
    # the jobs that may preempt: the planning point's batch, never a victim cut in this plan
    own = set(jobs) if isinstance(preemption, bool) else set(preemption)
    preemption = bool(preemption) and bool(state.running)

    def solve(lo: int, hi: int, limit_s: float) -> bool:
        """Solve window [lo, hi) of ``best`` and accept it when it scores lower."""
        nonlocal best, state, batch, jobs, n
        pre = wp.window_candidates(best, lo, hi, batch, state, eligible=own) if preemption else []
        sol = solve_window(best, lo, hi, jobs, state, limit_s, seed, workers, max_groups, verify_hint,
                            objective, pre, deterministic_s=window_deterministic_s)
        sols.append(sol)
        if sol is None or sol.objective >= sol.hint_objective:
            return False  # no better than the incumbent window in the model: not decoded
        if sol.taken:
            got = _accept_preemptive(best, hi, sol, state, batch, objective)
            if got is None:
                return False
            best, t = got
            state, batch, jobs, n = t.state, t.batch, {j.id: j for j in t.batch}, len(best.assignments)
            taken.append(t)
            return True
        assigns, quick = decode_window(best, lo, hi, sol.order, sol.groups, jobs, sol.prefix, state,
                                      objective)
        if quick >= score(best) - 1e-6:
            return False
        try:
            cand = evaluate(assigns, batch, state, "cpsat", objective=objective)
        except InfeasiblePlan:
            return False
        if score(cand) < score(best) - 1e-6:
            best = cand
            return True
        return False

    sols: list[Window | None] = []
    if preemption and n >= 1:
        hi = wp.preemptive_window_end(best, batch, state, k, max_window_jobs, own)
        if hi:
            windows += 1
            limit_s = min(time_limit_s * first_window_share, max(per_window, deadline - time.perf_counter()))
            if effort is not None:
                limit_s = max(0.01, deadline - time.perf_counter())
            improved += int(solve(0, hi, limit_s))
    if local:
        best, moves = _descend(best, batch, state, deadline, objective)
    while n >= 2 and windows_on and windows < max_windows:
        if not offsets:
            sweeps += 1
            all_optimal = sweep_optimal == sweep_windows
            if local:
                best, acc = _descend(best, batch, state, deadline, objective)
                moves += acc
                sweep_better += acc
            if not sweep_better:
                if k >= min(n, max_window_jobs):
                    break
                k = min(n, max_window_jobs, k + 4)
            offsets, sweep_better, sweep_optimal, sweep_windows = _offsets(n, k, rng), 0, 0, 0
        left = deadline - time.perf_counter()
        if left <= 0.01:
            break
        lo = offsets.pop()
        hi = min(n, lo + k)
        windows += 1
        sweep_windows += 1
        better = solve(lo, hi, min(left, per_window))
        improved += int(better)
        sweep_better += int(better)
        sweep_optimal += int(sols[-1] is not None and sols[-1].optimal)
    for sol in sols:
        if first is None:
            first = (float(sol.optimal), sol.objective) if sol is not None else (0.0, math.nan)
        optimal += int(sol is not None and sol.optimal)
    out = Plan("cpsat", list(best.assignments), best.objective, dict(best.stats))
    out.stats.update({"windows": float(windows), "improved": float(improved), "greedy_score": score(greedy),
                      "sweeps": float(sweeps), "local_moves": float(moves), "window_jobs": float(k), "windows_optimal": float(optimal),
                      "windows_all_optimal": float(all_optimal and not offsets),
                      "previous_score": prev_score, "previous_used": float(prev_used), "proven_optimal": 0.0})
    if first is not None:
        out.stats.update({"first_window_optimal": first[0], "first_window_objective": first[1]})
    out.stats["window_preemptions"] = float(sum(len(t.preemptions) for t in taken))
    branch = wp.branch_of(taken)
    return assemble(out, branch, objective) if branch is not None else out


def _accept_preemptive(best: Plan, hi: int, sol: Window, state: FleetState, batch: Sequence[PlanJob],
                       objective: str) -> tuple[Plan, wp.Taken] | None:
    """A window solution of ``best[0:hi]`` that takes preemptions, decoded on the state
    after them (:func:`makespan.planner.window_preemption.take`): (plan of the rest, the branch)
    when the rest's score plus the fixed completions' change is lower than ``best``'s."""
    try:
        t = wp.take(state, batch, sol.taken, objective)
    except ValueError:
        return None
    jobs = {j.id: j for j in t.batch}
    rep = Replay(t.state)
    assigns, quick = min((decode_window(inc, 0, hi, order, groups, jobs, rep, t.state, objective)
                          for inc, order, groups in wp.decodings(best, hi, sol.order, sol.groups, t)),
                         key=lambda d: d[1])
    if quick + t.fixed_delta >= score(best) - 1e-6:
        return None
    try:
        cand = evaluate(assigns, t.batch, t.state, "cpsat", objective=objective)
    except InfeasiblePlan:
        return None
    gain = score(best) - score(cand) - t.fixed_delta
    if gain <= 1e-6:
        return None
    t.preemptions = [replace(p, gain=gain / len(t.preemptions)) for p in t.preemptions]
    return cand, t


def cpsat_policy(batch: Sequence[PlanJob], state: FleetState, time_limit_s: float = 1.0, seed: int = 0,
                 num_workers: int = 1, previous: Plan | None = None,
                 preemption: bool | Collection[str] = False, first_window_share: float = 0.25,
                 effort: SearchEffort | None = None) -> Plan:
    """Policy ``cpsat`` (= ``default``): greedy portfolio, then the best of
        * batches of at most :data:`makespan.planner.exact.MAX_EXACT_JOBS` jobs: exact branch and
          bound (optimal when ``stats['exact']`` is 1);
        * batches :func:`makespan.planner.whole.applicable` to (≤ :data:`makespan.planner.whole.MAX_WHOLE_JOBS`
          single-GPU jobs without sleep mode): one CP-SAT model of the whole batch, hinted
          with the greedy plan;
        * otherwise :func:`improve` (windowed LNS; never a whole-plan proof);
    each within ``time_limit_s``, with ``num_workers`` CP-SAT search workers (default 1:
    deterministic), never worse than the greedy plan by score. ``previous`` (the plan of
    the last planning point) is repaired to ``batch`` (:func:`makespan.planner.previous.repair`) and
    starts every path instead of the greedy plan when it scores lower; then the result is
    never worse than it either. ``preemption``: the LNS path also decides preemptions in
    its windows at the plan's first job (:func:`improve`); the exact and whole-batch
    paths do not (``first_window_share``: as there). Under ``plan(..., preemption=True)`` it runs on the greedy floor's
    branch and, when the floor took preemptions, a second time on the batch without them
    (each with its share of the limit, :data:`makespan.planner.api.UNDO_SHARE`); the caller keeps
    the better plan (:func:`makespan.planner.api.comparable_score`). ``effort``: bound
    each path by its work instead (:class:`SearchEffort`; ``time_limit_s`` a backstop).
    ``stats['proven_optimal']``
    is 1 only when the returned plan is proven optimal for the whole batch (objective
    Σ w_j (C_j − r_j); see :mod:`makespan.planner.whole` for how the proof is checked).

    Raises:
        PlannerError: ``num_workers`` < 1."""
    if num_workers < 1:
        raise PlannerError(f"num_workers must be >= 1, got {num_workers}")
    floor = portfolio(batch, state)
    if len(batch) > MAX_EXACT_JOBS and not whole.applicable(batch, state):
        return improve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers,
                       previous=previous, preemption=preemption, first_window_share=first_window_share,
                       effort=effort)
    greedy_score = score(floor)
    floor, prev_score, prev_used = start_plan(floor, previous, batch, state)
    prev_stats = {"greedy_score": greedy_score, "previous_score": prev_score, "previous_used": float(prev_used)}
    if len(batch) <= MAX_EXACT_JOBS:
        out = exact(batch, state, floor, time_limit_s=time_limit_s)
        out.stats.update(prev_stats)
        out.policy = "cpsat"
        out.stats["proven_optimal"] = out.stats["exact"]
        return out
    # whole.applicable (checked above)
    sol = whole.solve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers,
                      deterministic_s=effort.deterministic_s if effort is not None else None)
    if sol is not None and score(sol) <= score(floor) + 1e-9:
        sol.stats.update(prev_stats)
        return sol
    out = Plan("cpsat", list(floor.assignments), floor.objective, dict(floor.stats))
    out.stats.update({**prev_stats, "proven_optimal": 0.0,
                      "whole_status": sol.stats["whole_status"] if sol is not None else 0.0})
    return out
