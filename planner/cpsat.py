"""CP-SAT improver: local search and windowed large-neighbourhood search over the greedy plan.

Search (:func:`improve`), all within one wall-time limit: the start plan is the greedy
portfolio plan, or the previous planning point's plan repaired to this batch when that
scores lower (:mod:`planner.previous`); then first-improvement passes of swap/regroup
moves (:func:`planner.local.descent`) until a local optimum of that neighbourhood; then
sweeps of CP-SAT windows (the larger neighbourhood, to leave it), each followed by
descent to a local optimum again. A sweep solves every window of ``k`` consecutive jobs
of the incumbent (start order, half overlapping, seeded random order); ``k`` grows by 4
after a sweep that improved nothing. A window's solution is decoded into a whole plan (prefix as
is, window in the model's order and groups, suffix in its old order and groups, all
re-placed through the exact replay, :func:`planner.local.decode_window`) and accepted
only if :func:`planner.evaluator.evaluate` scores it lower, so the result is never worse
than the start plan. A solution whose model objective is not below the incumbent's is
not decoded.

Model of a window (integer seconds, time 0 = planning time):
    data:        window jobs; the GPUs they use; for each job up to ``max_groups``
                 candidate groups inside those GPUs (its incumbent group first, then groups
                 that already hold its model, then the earliest free);
    variables:   optional residency interval R[g,m] "model m resident on group g" (at most
                 one per group and model in a window) whose first σ[g,m] seconds are its
                 transition (0 if g already holds m — then it must come first on g —, else
                 an upper bound of the replay's: the largest evict among g's residents and
                 the window's endpoints, + wake or cold start); per job and candidate group
                 a presence literal and an optional interval of length p_j;
    constraints: each job on exactly one group, inside a present residency of its model
                 after its transition; no overlap of residencies, nor of jobs, on any GPU;
                 residencies start when their GPUs are free; jobs start after release and
                 in-window dependencies;
    objective:   Σ w_j·C_j + 1 per transition second (a small cost per transition);
                 with ``objective="weighted_tardiness"``, 1000·Σ w_j·T_j (T_j ≥ C_j − d_j,
                 T_j ≥ 0, jobs with a deadline) is added: tardiness first, the
                 completion sum as tie-break (the evaluator's score decides acceptance).
The incumbent window is given as a complete hint, built to satisfy the model (its jobs in
order on their groups at the earliest starts the model allows, :func:`_hint`); with
``verify_hint`` it is also checked by fixing every hinted variable. Deterministic up to
the wall clock: fixed ``seed``, ``workers`` search workers (default 1); how far the search
gets depends on the time limit and the machine's speed.
Running work is never moved: it lives in ``FleetState.free_at``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from app.errors import PlannerError
from planner.evaluator import InfeasiblePlan, evaluate, score
from planner import whole
from planner.exact import MAX_EXACT_JOBS, exact
from planner.greedy import portfolio
from planner.model import Assignment, FleetState, Plan, PlanJob
from planner.local import decode_window, descent
from planner.previous import start_plan
from planner.replay import Group, Replay


@dataclass
class _Window:
    """A solved window: the model's job order and groups, whether CP-SAT proved it, the
    model objective and the incumbent's (the hint's; inf without a hint), and the replay
    after the prefix."""

    order: list[str]
    groups: dict[str, Group]
    optimal: bool
    objective: float
    hint_objective: float
    prefix: Replay


def _hint(win: Sequence[Assignment], cands: dict[str, list[Group]], res: dict, x: dict, start: dict,
          jobs: dict[str, PlanJob], rep: Replay, ti) -> list[tuple[object, int]] | None:
    """The incumbent window as a complete solution of the window model: its jobs in their
    start order on their groups, each at the earliest start the model allows (the model's
    transitions σ are upper bounds of the replay's, so the replay's own times may violate
    it). None when the model cannot express the incumbent (a group returning to a model
    after another one: one residency per group and model)."""
    free = {u: ti(rep.free_at[u]) for a in win for u in a.gpus}
    opened: dict[tuple[Group, str], list[int]] = {}
    closed: set[tuple[Group, str]] = set()
    hint: list[tuple[object, int]] = []
    hinted_start: dict[str, int] = {}  # job id -> its hinted start (the dependencies' ends)
    for a in win:
        j = jobs[a.job_id]
        g, k = tuple(a.gpus), (tuple(a.gpus), j.endpoint)
        if k in closed or k not in res:
            return None
        _p, _s, _e, _iv, sigma, warm = res[k]
        for k2 in opened:  # another model's residency on these GPUs ends here
            if k2 != k and set(k2[0]) & set(g):
                if warm and k2[1] != j.endpoint:
                    return None
                closed.add(k2)
        if k not in opened:
            opened[k] = [max(free.get(u, 0) for u in g), 0]
        s0 = max([ti(rep.ready(j)), opened[k][0] + sigma] + [free[u] for u in g] +
                 [hinted_start.get(d, 0) + int(math.ceil(jobs[d].service_s)) for d in j.deps if d in start])
        end = s0 + int(math.ceil(j.service_s))
        opened[k][1] = end
        for u in g:
            free[u] = end
        hint.append((start[a.job_id], s0))
        hinted_start[a.job_id] = s0
        hint += [(x[(a.job_id, c)], int(c == g)) for c in cands[a.job_id]]
    for k, (p, s, e, *_r) in res.items():
        hint += [(p, 1), (s, opened[k][0]), (e, opened[k][1])] if k in opened else [(p, 0)]
    return hint


def _solve_window(inc: Plan, lo: int, hi: int, jobs: dict[str, PlanJob], state: FleetState,
                  time_limit_s: float, seed: int, workers: int, max_groups: int,
                  verify_hint: bool, objective: str = "weighted_completion") -> _Window | None:
    rep = Replay(state)
    for a in inc.assignments[:lo]:
        rep.place(jobs[a.job_id], a.gpus, a.start_s)
    win = inc.assignments[lo:hi]
    gpus = {u for a in win for u in a.gpus}
    t0 = state.now_s
    eps = state.endpoints

    def ti(x: float) -> int:
        return int(math.ceil(x - t0 - 1e-9))

    cands: dict[str, list[Group]] = {}
    for a in win:
        ep = eps[jobs[a.job_id].endpoint]
        gs = [g for g in rep.groups(ep) if set(g) <= gpus and g != tuple(a.gpus)]
        gs.sort(key=lambda g: (not all(rep.resident[u] == ep.name for u in g), rep.group_free(g)))
        cands[a.job_id] = [tuple(a.gpus)] + gs[:max_groups - 1]
    horizon = ti(max(a.end_s for a in win)) + int(max(e.cold_start_s + e.evict_s for e in eps.values())) * 2 + 10
    m = cp_model.CpModel()
    res: dict[tuple[Group, str], tuple] = {}
    by_gpu_res: dict[str, list] = {u: [] for u in gpus}
    for jid, gs in cands.items():
        name = jobs[jid].endpoint
        for g in gs:
            if (g, name) in res:
                continue
            ep = eps[name]
            warm = all(rep.resident[u] == name for u in g)
            if warm:
                sigma = 0
            else:
                ev = max((eps[r].evict_s for u in g for r in [rep.resident[u]] if r in eps), default=0.0)
                ev = max([ev] + [eps[jobs[j].endpoint].evict_s for j in cands])
                load = ep.wake_s if ep.wake_s is not None and all(name in rep.asleep[u] for u in g) else ep.cold_start_s
                sigma = int(math.ceil(ev + load))
            p = m.NewBoolVar("")
            s = m.NewIntVar(max(0, ti(rep.group_free(g))), horizon, "")
            e = m.NewIntVar(0, horizon, "")
            size = m.NewIntVar(0, horizon, "")
            iv = m.NewOptionalIntervalVar(s, size, e, p, "")
            res[(g, name)] = (p, s, e, iv, sigma, warm)
            for u in g:
                by_gpu_res[u].append((g, name))
    for (g, name), (p, s, e, iv, sigma, warm) in res.items():
        if warm:  # a resident model is served first on its group, before anything evicts it
            for (g2, n2), (p2, s2, *_r) in res.items():
                if n2 != name and set(g2) & set(g):
                    m.Add(s2 >= e).OnlyEnforceIf([p, p2])
    x: dict[tuple[str, Group], object] = {}
    start: dict[str, object] = {}
    by_gpu_job: dict[str, list] = {u: [] for u in gpus}
    obj = []
    wj: dict[str, tuple[int, int]] = {}
    due: dict[str, int] = {}  # model due time of jobs with a deadline (weighted tardiness)
    for jid, gs in cands.items():
        j = jobs[jid]
        pj = int(math.ceil(j.service_s))
        s = m.NewIntVar(max(0, ti(rep.ready(j))), horizon, "")
        start[jid] = s
        lits = []
        for g in gs:
            lit = m.NewBoolVar("")
            lits.append(lit)
            x[(jid, g)] = lit
            rp, rs, re, _iv, sigma, _w = res[(g, j.endpoint)]
            m.AddImplication(lit, rp)
            m.Add(s >= rs + sigma).OnlyEnforceIf(lit)
            m.Add(s + pj <= re).OnlyEnforceIf(lit)
            iv = m.NewOptionalFixedSizeIntervalVar(s, pj, lit, "")
            for u in g:
                by_gpu_job[u].append(iv)
        m.AddExactlyOne(lits)
        for d in j.deps:
            if d in start:
                m.Add(s >= start[d] + int(math.ceil(jobs[d].service_s)))
        wj[jid] = (int(round(j.weight * 10)), pj)
        obj.append(wj[jid][0] * (s + pj))
        if objective == "weighted_tardiness" and j.deadline_s is not None:
            due[jid] = int(math.floor(j.deadline_s - t0))
            late = m.NewIntVar(0, horizon + max(0, -due[jid]), "")  # a deadline already past: late > horizon
            m.Add(late >= s + pj - due[jid])
            obj.append(1000 * wj[jid][0] * late)
    for u in gpus:
        m.AddNoOverlap([res[k][3] for k in by_gpu_res[u]])
        m.AddNoOverlap(by_gpu_job[u])
    obj.extend(v[0] * v[4] for v in res.values())
    m.Minimize(sum(obj))
    hint = _hint(win, cands, res, x, start, jobs, rep, ti)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_search_workers = workers
    prm.cp_model_probing_level = 0
    if hint is None:
        pass
    elif verify_hint:
        fixed = m.Clone()
        for v, val in hint:
            fixed.Add(v == val)  # type: ignore[operator]
        prm.max_time_in_seconds = min(0.05, time_limit_s)
        ok = solver.Solve(fixed) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        if ok:
            for v, val in hint:
                m.AddHint(v, val)
    else:
        for v, val in hint:
            m.AddHint(v, val)
    prm.max_time_in_seconds = max(0.01, time_limit_s)
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    groups = {jid: next(g for g in gs if solver.Value(x[(jid, g)])) for jid, gs in cands.items()}
    order = sorted(cands, key=lambda jid: (solver.Value(start[jid]), jid))
    hint_obj = math.inf
    if hint is not None:
        hv = dict(hint)
        hint_obj = (sum(c * (hv[start[jid]] + pj) for jid, (c, pj) in wj.items())
                    + sum(v[4] * hv[v[0]] for v in res.values())
                    + sum(1000 * wj[jid][0] * max(0, hv[start[jid]] + wj[jid][1] - d) for jid, d in due.items()))
    return _Window(order, groups, st == cp_model.OPTIMAL, solver.ObjectiveValue(), hint_obj, rep)


def _descend(best: Plan, batch: Sequence[PlanJob], state: FleetState, deadline: float,
             objective: str) -> tuple[Plan, int]:
    """Descent passes (:func:`planner.local.descent`) until one accepts no move (a local
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
            objective: str = "weighted_completion") -> Plan:
    """Local search and windowed LNS over ``greedy`` (an evaluated plan) for
    ``time_limit_s`` wall seconds (module doc).

    Windows of ``k`` jobs (from ``window_jobs``, growing by 4 up to ``max_window_jobs``)
    are solved for at most ``window_limit_s`` each (default: the limit ÷ 20, within
    0.02–0.25 s); the search ends at the time limit or after a sweep of the largest
    windows and the descent after it improved nothing. ``local``: descend with swap/regroup
    moves (:func:`planner.local.descent`, passes until one accepts nothing) first and
    after every sweep; ``windows_on`` False: the descent only (a comparison mode, no
    CP-SAT). ``previous``: a plan of an earlier planning point; repaired to this batch
    (:func:`planner.previous.repair`) and used as the start when it scores lower than
    ``greedy``.

    Returns the best evaluated plan (``policy`` "cpsat"; stats: windows, improved (accepted
    windows), local_moves (accepted descent moves), sweeps, window_jobs (the last size),
    greedy_score, previous_score (NaN without ``previous``), previous_used;
    windows_optimal = window solves CP-SAT proved optimal; first_window_optimal and
    first_window_objective = status (1/0) and model objective of the first window;
    windows_all_optimal = 1 when the search ended with a full sweep whose every window was
    proved optimal — a local optimum per window, not a proof for the whole batch, so
    proven_optimal is always 0 here). Never worse than ``greedy`` (nor than the repaired
    ``previous``) by score, for ``objective`` (:data:`planner.evaluator.OBJECTIVES`;
    ``greedy`` scored for it too)."""
    deadline = time.perf_counter() + time_limit_s
    jobs = {j.id: j for j in batch}
    best, prev_score, prev_used = start_plan(greedy, previous, batch, state, objective)
    n = len(best.assignments)
    rng = random.Random(seed)
    per_window = window_limit_s if window_limit_s is not None else min(0.25, max(0.02, time_limit_s / 20))
    windows = improved = optimal = sweeps = moves = 0
    sweep_better = sweep_optimal = sweep_windows = 0
    first: tuple[float, float] | None = None
    k = min(window_jobs, n)
    offsets = _offsets(n, k, rng)
    all_optimal = False
    if local:
        best, moves = _descend(best, batch, state, deadline, objective)
    while n >= 2 and windows_on:
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
        sol = _solve_window(best, lo, hi, jobs, state, min(left, per_window), seed, workers, max_groups, verify_hint,
                            objective)
        if first is None:
            first = (float(sol.optimal), sol.objective) if sol is not None else (0.0, math.nan)
        if sol is None:
            continue
        optimal += int(sol.optimal)
        sweep_optimal += int(sol.optimal)
        if sol.objective >= sol.hint_objective:
            continue  # no better than the incumbent window in the model: not decoded
        assigns, quick = decode_window(best, lo, hi, sol.order, sol.groups, jobs, sol.prefix, state,
                                      objective)
        if quick >= score(best) - 1e-6:
            continue
        try:
            cand = evaluate(assigns, batch, state, "cpsat", objective=objective)
        except InfeasiblePlan:
            continue
        if score(cand) < score(best) - 1e-6:
            best = cand
            improved += 1
            sweep_better += 1
    out = Plan("cpsat", list(best.assignments), best.objective, dict(best.stats))
    out.stats.update({"windows": float(windows), "improved": float(improved), "greedy_score": score(greedy),
                      "sweeps": float(sweeps), "local_moves": float(moves), "window_jobs": float(k), "windows_optimal": float(optimal),
                      "windows_all_optimal": float(all_optimal and not offsets),
                      "previous_score": prev_score, "previous_used": float(prev_used), "proven_optimal": 0.0})
    if first is not None:
        out.stats.update({"first_window_optimal": first[0], "first_window_objective": first[1]})
    return out


def cpsat_policy(batch: Sequence[PlanJob], state: FleetState, time_limit_s: float = 1.0, seed: int = 0,
                 num_workers: int = 1, previous: Plan | None = None) -> Plan:
    """Policy ``cpsat`` (= ``default``): greedy portfolio, then the best of
        * batches of at most :data:`planner.exact.MAX_EXACT_JOBS` jobs: exact branch and
          bound (optimal when ``stats['exact']`` is 1);
        * batches :func:`planner.whole.applicable` to (≤ :data:`planner.whole.MAX_WHOLE_JOBS`
          single-GPU jobs without sleep mode): one CP-SAT model of the whole batch, hinted
          with the greedy plan;
        * otherwise :func:`improve` (windowed LNS; never a whole-plan proof);
    each within ``time_limit_s``, with ``num_workers`` CP-SAT search workers (default 1:
    deterministic), never worse than the greedy plan by score. ``previous`` (the plan of
    the last planning point) is repaired to ``batch`` (:func:`planner.previous.repair`) and
    starts every path instead of the greedy plan when it scores lower; then the result is
    never worse than it either. ``stats['proven_optimal']``
    is 1 only when the returned plan is proven optimal for the whole batch (objective
    Σ w_j (C_j − r_j); see :mod:`planner.whole` for how the proof is checked).

    Raises:
        PlannerError: ``num_workers`` < 1."""
    if num_workers < 1:
        raise PlannerError(f"num_workers must be >= 1, got {num_workers}")
    floor = portfolio(batch, state)
    if len(batch) > MAX_EXACT_JOBS and not whole.applicable(batch, state):
        return improve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers,
                       previous=previous)
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
    sol = whole.solve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers)
    if sol is not None and score(sol) <= score(floor) + 1e-9:
        sol.stats.update(prev_stats)
        return sol
    out = Plan("cpsat", list(floor.assignments), floor.objective, dict(floor.stats))
    out.stats.update({**prev_stats, "proven_optimal": 0.0,
                      "whole_status": sol.stats["whole_status"] if sol is not None else 0.0})
    return out
