"""CP-SAT improver: windowed large-neighbourhood search over the greedy portfolio plan.

Per window (``window_jobs`` consecutive jobs of the incumbent in start order) a
"residency" model is built and solved (OR-Tools CP-SAT, Perron & Didier 2024); its
solution is decoded into a whole plan (prefix as is, window in the model's order and
groups, suffix in its old order and groups, all re-placed through the exact replay) and
scored by :func:`planner.evaluator.evaluate`. A candidate replaces the incumbent only if
its score is lower, so the result is never worse than the greedy floor.

Model of a window (integer seconds, time 0 = planning time):
    data:        window jobs; the GPUs they use; for each job up to ``max_groups``
                 candidate groups inside those GPUs (its incumbent group first, then groups
                 that already hold its model, then the earliest free);
    variables:   optional residency interval R[g,m] "model m resident on group g" (at most
                 one per group and model in a window) whose first σ[g,m] seconds are its
                 transition (0 if g already holds m — then it must come first on g —, else
                 the largest evict on g + wake or cold start); per job and candidate group
                 a presence literal and an optional interval of length p_j;
    constraints: each job on exactly one group, inside a present residency of its model
                 after its transition; no overlap of residencies, nor of jobs, on any GPU;
                 residencies start when their GPUs are free; jobs start after release and
                 in-window dependencies;
    objective:   Σ w_j·C_j + 1 per transition second (a small cost per transition);
                 with ``objective="weighted_tardiness"``, 1000·Σ w_j·T_j (T_j ≥ C_j − d_j,
                 T_j ≥ 0, jobs with a deadline) is added: tardiness first, the
                 completion sum as tie-break (the evaluator's score decides acceptance).
The incumbent window is given as a complete hint; with ``verify_hint`` it is first
checked by fixing every hinted variable (an infeasible hint fails silently otherwise)
and dropped if infeasible. Deterministic: fixed ``seed``, ``workers`` search workers
(default 1), a wall-time limit per solve and overall.
Running work is never moved: it lives in ``FleetState.free_at``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

from ortools.sat.python import cp_model

from app.errors import PlannerError
from planner.evaluator import InfeasiblePlan, evaluate, score
from planner import whole
from planner.exact import MAX_EXACT_JOBS, exact
from planner.greedy import portfolio
from planner.model import Assignment, FleetState, Plan, PlanJob
from planner.replay import Group, Replay


def _decode(inc: Plan, lo: int, hi: int, order: list[str], groups: dict[str, Group],
            jobs: dict[str, PlanJob], state: FleetState) -> list[Assignment]:
    rep = Replay(state)
    out: list[Assignment] = []
    a_sorted = inc.assignments
    for a in a_sorted[:lo]:
        out.append(rep.place(jobs[a.job_id], a.gpus, a.start_s))
    for jid in order:
        out.append(rep.place(jobs[jid], groups[jid]))
    for a in a_sorted[hi:]:
        out.append(rep.place(jobs[a.job_id], a.gpus))
    return out


def _solve_window(inc: Plan, lo: int, hi: int, jobs: dict[str, PlanJob], state: FleetState,
                  time_limit_s: float, seed: int, workers: int, max_groups: int,
                  verify_hint: bool, objective: str = "weighted_completion",
                  ) -> tuple[list[str], dict[str, Group], bool, float] | None:
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
        obj.append(int(round(j.weight * 10)) * (s + pj))
        if objective == "weighted_tardiness" and j.deadline_s is not None:
            late = m.NewIntVar(0, horizon, "")
            m.Add(late >= s + pj - int(math.floor(j.deadline_s - t0)))
            obj.append(1000 * int(round(j.weight * 10)) * late)
    for u in gpus:
        m.AddNoOverlap([res[k][3] for k in by_gpu_res[u]])
        m.AddNoOverlap(by_gpu_job[u])
    obj.extend(v[0] * v[4] for v in res.values())
    m.Minimize(sum(obj))
    # hint: the incumbent window
    hint: list[tuple[object, int]] = []
    first_last: dict[tuple[Group, str], list[float]] = {}
    for a in win:
        k = (tuple(a.gpus), jobs[a.job_id].endpoint)
        fl = first_last.setdefault(k, [a.service_start_s, a.end_s])
        fl[0], fl[1] = min(fl[0], a.service_start_s), max(fl[1], a.end_s)
        for g in cands[a.job_id]:
            hint.append((x[(a.job_id, g)], int(g == tuple(a.gpus))))
        hint.append((start[a.job_id], ti(a.service_start_s)))
    for k, (p, s, e, *_r) in res.items():
        if k in first_last:
            sigma = res[k][4]
            hint += [(p, 1), (s, max(0, ti(first_last[k][0]) - sigma)), (e, ti(first_last[k][1]))]
        else:
            hint.append((p, 0))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_search_workers = workers
    prm.cp_model_probing_level = 0
    if verify_hint:
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
    return order, groups, st == cp_model.OPTIMAL, solver.ObjectiveValue()


def improve(batch: Sequence[PlanJob], state: FleetState, greedy: Plan, time_limit_s: float = 1.0,
            seed: int = 0, workers: int = 1, window_jobs: int = 10, max_groups: int = 4,
            verify_hint: bool = True, objective: str = "weighted_completion") -> Plan:
    """LNS over ``greedy`` (an evaluated plan) for ``time_limit_s`` wall seconds.

    Returns the best evaluated plan (``policy`` "cpsat"; stats: windows, improved,
    greedy_score; windows_optimal = window solves CP-SAT proved optimal; first_window_optimal
    and first_window_objective = status (1/0) and model objective of the first window, whose
    model depends only on ``greedy`` and ``seed``, so it is equal for any ``workers`` when
    proven; windows_all_optimal = 1 when every window of the sweep was solved and proved
    optimal — a local optimum per window, not a proof for the whole batch, so
    proven_optimal is always 0 here). Never worse than ``greedy`` by score, for
    ``objective`` (:data:`planner.evaluator.OBJECTIVES`; ``greedy`` scored for it too)."""
    deadline = time.perf_counter() + time_limit_s
    jobs = {j.id: j for j in batch}
    best = greedy
    n = len(best.assignments)
    rng = random.Random(seed)
    windows = improved = optimal = 0
    first: tuple[float, float] | None = None
    k = min(window_jobs, n)
    offsets = list(range(0, max(1, n - k + 1), max(1, k // 2)))
    rng.shuffle(offsets)
    while offsets and n >= 2:
        left = deadline - time.perf_counter()
        if left <= 0.02:
            break
        lo = offsets.pop()
        hi = min(n, lo + k)
        windows += 1
        sol = _solve_window(best, lo, hi, jobs, state, min(left, max(0.05, time_limit_s / 4)),
                            seed, workers, max_groups, verify_hint, objective)
        if first is None:
            first = (float(sol[2]), sol[3]) if sol is not None else (0.0, math.nan)
        if sol is None:
            continue
        optimal += int(sol[2])
        try:
            cand = evaluate(_decode(best, lo, hi, sol[0], sol[1], jobs, state), batch, state, "cpsat",
                            objective=objective)
        except InfeasiblePlan:
            continue
        if score(cand) < score(best) - 1e-6:
            best = cand
            improved += 1
    out = Plan("cpsat", list(best.assignments), best.objective, dict(best.stats))
    out.stats.update({"windows": float(windows), "improved": float(improved), "greedy_score": score(greedy),
                      "windows_optimal": float(optimal),
                      "windows_all_optimal": float(windows > 0 and not offsets and optimal == windows),
                      "proven_optimal": 0.0})
    if first is not None:
        out.stats.update({"first_window_optimal": first[0], "first_window_objective": first[1]})
    return out


def cpsat_policy(batch: Sequence[PlanJob], state: FleetState, time_limit_s: float = 1.0, seed: int = 0,
                 num_workers: int = 1) -> Plan:
    """Policy ``cpsat`` (= ``default``): greedy portfolio, then the best of
        * batches of at most :data:`planner.exact.MAX_EXACT_JOBS` jobs: exact branch and
          bound (optimal when ``stats['exact']`` is 1);
        * batches :func:`planner.whole.applicable` to (≤ :data:`planner.whole.MAX_WHOLE_JOBS`
          single-GPU jobs without sleep mode): one CP-SAT model of the whole batch, hinted
          with the greedy plan;
        * otherwise :func:`improve` (windowed LNS; never a whole-plan proof);
    each within ``time_limit_s``, with ``num_workers`` CP-SAT search workers (default 1:
    deterministic), never worse than the greedy plan by score. ``stats['proven_optimal']``
    is 1 only when the returned plan is proven optimal for the whole batch (objective
    Σ w_j (C_j − r_j); see :mod:`planner.whole` for how the proof is checked).

    Raises:
        PlannerError: ``num_workers`` < 1."""
    if num_workers < 1:
        raise PlannerError(f"num_workers must be >= 1, got {num_workers}")
    floor = portfolio(batch, state)
    if len(batch) <= MAX_EXACT_JOBS:
        out = exact(batch, state, floor, time_limit_s=time_limit_s)
        out.policy = "cpsat"
        out.stats["proven_optimal"] = out.stats["exact"]
        return out
    if whole.applicable(batch, state):
        sol = whole.solve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers)
        if sol is not None and score(sol) <= score(floor) + 1e-9:
            sol.stats["greedy_score"] = score(floor)
            return sol
        out = Plan("cpsat", list(floor.assignments), floor.objective, dict(floor.stats))
        out.stats.update({"greedy_score": score(floor), "proven_optimal": 0.0,
                          "whole_status": sol.stats["whole_status"] if sol is not None else 0.0})
        return out
    return improve(batch, state, floor, time_limit_s=time_limit_s, seed=seed, workers=num_workers)
