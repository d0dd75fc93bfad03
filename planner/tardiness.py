"""Weighted-tardiness objective for jobs with a deadline: Σ w_j·max(0, C_j − d_j).

Scope: one GPU (or one GPU group that every job uses), jobs of one endpoint or with no
transitions between them — the setting of the OR-Library wt40/wt50 benchmark
(Potts & Van Wassenhove 1985; Crauwels, Potts & Van Wassenhove 1998). Jobs without a
deadline (``deadline_s`` None) have d_j = +∞ and never count.

Method (deterministic for a seed):
    1. constructive rules, each a permutation, the best kept: EDD, WSPT (Smith's rule) and
       the apparent-tardiness-cost rule ATC (Vepsalainen & Morton 1987) for a few look-
       ahead factors k;
    2. local-search descent on that permutation: pairwise swaps and single-job moves
       (insertion), first improvement, until no move improves; then iterated local search
       (Lourenço, Martin & Stützle 2003): perturb the best sequence by a few random swaps
       (seeded), descend again, keep the result if not worse — for ``ils_fraction`` of
       the budget or until ``target`` is reached;
    3. CP-SAT (Perron & Didier 2024): integer start/end per job, one ``NoOverlap`` of
       fixed-size intervals, T_j ≥ C_j − d_j, T_j ≥ 0, minimise Σ w_j T_j; started from
       the local-search sequence as a complete hint, a lower bound of 0, ``workers``
       search workers, a fixed seed and the remaining wall time. It stops early when it
       proves optimality or reaches a known target.
Returns the best sequence scored exactly (integer times when the inputs are integers).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from makespan.errors import PlannerError
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob


@dataclass
class WtResult:
    """Outcome of :func:`solve_single_machine`.

    Attributes:
        order: indices of the jobs in processing order.
        value: Σ w_j·max(0, C_j − d_j) of ``order`` (weight·s).
        heuristic_value: the value after steps 1–2 (before CP-SAT).
        optimal: CP-SAT proved ``value`` optimal.
        wall_s: time spent, s.
    """

    order: list[int]
    value: float
    heuristic_value: float
    optimal: bool
    wall_s: float


def weighted_tardiness(order: Sequence[int], p: Sequence[float], w: Sequence[float], d: Sequence[float],
                       t0: float = 0.0) -> float:
    """Σ w_j·max(0, C_j − d_j) of a sequence on one machine starting at ``t0``."""
    t, tot = t0, 0.0
    for j in order:
        t += p[j]
        if t > d[j]:
            tot += w[j] * (t - d[j])
    return tot


def _atc(p: Sequence[float], w: Sequence[float], d: Sequence[float], k: float) -> list[int]:
    n = len(p)
    pbar = sum(p) / n if n else 1.0
    left, t, out = set(range(n)), 0.0, []
    while left:
        j = max(left, key=lambda i: (w[i] / p[i]) * math.exp(-max(d[i] - p[i] - t, 0.0) / (k * pbar)) if p[i] > 0
                else float("inf"))
        out.append(j)
        left.remove(j)
        t += p[j]
    return out


def _descent(order: list[int], p: Sequence[float], w: Sequence[float], d: Sequence[float],
             deadline: float) -> tuple[list[int], float]:
    """Swap and insertion descent (first improvement) until a local optimum or ``deadline``."""
    best = weighted_tardiness(order, p, w, d)
    n = len(order)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for i in range(n - 1):
            for k in range(i + 1, n):
                order[i], order[k] = order[k], order[i]
                v = weighted_tardiness(order, p, w, d)
                if v < best - 1e-9:
                    best, improved = v, True
                else:
                    order[i], order[k] = order[k], order[i]
        for i in range(n):
            job = order.pop(i)
            bk, bv = i, best
            for k in range(n):
                order.insert(k, job)
                v = weighted_tardiness(order, p, w, d)
                order.pop(k)
                if v < bv - 1e-9:
                    bk, bv = k, v
            order.insert(bk, job)
            if bk != i:
                best, improved = bv, True
        if time.perf_counter() >= deadline:
            break
    return order, best


def solve_single_machine(p: Sequence[float], w: Sequence[float], d: Sequence[float], time_limit_s: float = 10.0,
                         seed: int = 0, workers: int = 1, target: float | None = None,
                         ils_fraction: float = 0.7) -> WtResult:
    """Minimise Σ w_j·max(0, C_j − d_j) on one machine, all jobs released at 0 (module doc).

    Args:
        p: processing times, s (> 0). w: weights (≥ 0). d: due dates, s (``math.inf``: none).
        time_limit_s: wall-time budget for all three steps, s.
        seed, workers: CP-SAT random seed and search workers.
        target: stop as soon as a sequence of at most this value is found (a known optimum).
        ils_fraction: share of the budget for steps 1–2 (the rest goes to CP-SAT).

    Raises:
        PlannerError: lengths differ, or a processing time is not positive.
    """
    t_start = time.perf_counter()
    deadline = t_start + time_limit_s
    n = len(p)
    if not (len(w) == len(d) == n):
        raise PlannerError(f"p, w, d lengths differ: {n}, {len(w)}, {len(d)}")
    if any(x <= 0 for x in p):
        raise PlannerError(f"processing time must be > 0, got {min(p)}")
    if n == 0:
        return WtResult([], 0.0, 0.0, True, 0.0)
    starts = [sorted(range(n), key=lambda j: (d[j], j)), sorted(range(n), key=lambda j: (p[j] / max(w[j], 1e-12), j))]
    starts += [_atc(p, w, d, k) for k in (0.5, 1.0, 2.0, 4.0)]
    order = min(starts, key=lambda o: weighted_tardiness(o, p, w, d))
    ls_deadline = t_start + time_limit_s * ils_fraction
    order, val = _descent(list(order), p, w, d, ls_deadline)
    rng = random.Random(seed)
    while val > 0 and (target is None or val > target) and time.perf_counter() < ls_deadline:
        cand = list(order)
        for _ in range(rng.randint(2, 4)):
            i, k = rng.randrange(n), rng.randrange(n)
            cand[i], cand[k] = cand[k], cand[i]
        cand, v = _descent(cand, p, w, d, ls_deadline)
        if v <= val:
            order, val = cand, v
    heur = val
    optimal = val == 0.0
    left = deadline - time.perf_counter()
    if not optimal and (target is None or val > target) and left > 0.05:
        order, val, optimal = _cpsat(p, w, d, order, val, left, seed, workers, target)
    return WtResult(order, val, heur, optimal, time.perf_counter() - t_start)


class _Target(cp_model.CpSolverSolutionCallback):
    def __init__(self, obj_target: float | None):
        super().__init__()
        self.obj_target = obj_target

    def on_solution_callback(self) -> None:
        if self.obj_target is not None and self.ObjectiveValue() <= self.obj_target + 1e-9:
            self.StopSearch()


def _cpsat(p, w, d, hint_order, hint_val, time_limit_s, seed, workers, target):
    scale = 1 if all(float(x).is_integer() for x in list(p) + [x for x in d if math.isfinite(x)]) else 1000
    pi = [int(round(x * scale)) for x in p]
    horizon = sum(pi)
    wi = [int(round(x)) if float(x).is_integer() else int(round(x * 1000)) for x in w]
    wscale = 1 if all(float(x).is_integer() for x in w) else 1000
    m = cp_model.CpModel()
    s_v, e_v, t_v, ivs = [], [], [], []
    for j in range(len(p)):
        s = m.NewIntVar(0, horizon - pi[j], "")
        e = m.NewIntVar(pi[j], horizon, "")
        ivs.append(m.NewIntervalVar(s, pi[j], e, ""))
        s_v.append(s)
        e_v.append(e)
        if math.isfinite(d[j]):
            dj = int(math.floor(d[j] * scale))
            t = m.NewIntVar(0, max(0, horizon - dj), "")
            m.Add(t >= e - dj)
            t_v.append((wi[j], t))
    m.AddNoOverlap(ivs)
    m.Minimize(sum(c * t for c, t in t_v))
    tt = 0
    for j in hint_order:
        m.AddHint(s_v[j], tt)
        m.AddHint(e_v[j], tt + pi[j])
        tt += pi[j]
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_search_workers = workers
    prm.max_time_in_seconds = time_limit_s
    st = solver.Solve(m, _Target(None if target is None else target * scale * wscale))
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return hint_order, hint_val, False
    order = sorted(range(len(p)), key=lambda j: (solver.Value(s_v[j]), j))
    val = weighted_tardiness(order, p, w, d)
    if val < hint_val:
        return order, val, st == cp_model.OPTIMAL
    return hint_order, hint_val, st == cp_model.OPTIMAL and val <= hint_val


def tardiness_plan(batch: Sequence[PlanJob], state: FleetState, time_limit_s: float = 1.0, seed: int = 0) -> Plan:
    """Plan ``batch`` on the fleet's single GPU minimising weighted tardiness (module doc).

    Every job runs on ``state.gpus[0]``, all of one endpoint (evict + cold start first
    unless it is resident); jobs are taken as released (the OR-Library setting). ``Plan.objective`` = Σ w_j·max(0, C_j − d_j);
    ``stats`` {weighted_tardiness, weighted_completion, optimal}.

    Raises:
        PlannerError: the fleet has not exactly one GPU, or jobs use several endpoints.
    """
    if len(state.gpus) != 1:
        raise PlannerError(f"weighted tardiness is implemented for one GPU; fleet has {len(state.gpus)}")
    eps = {j.endpoint for j in batch}
    if len(eps) > 1:
        raise PlannerError(f"weighted tardiness is implemented for one endpoint; batch uses {sorted(eps)}")
    u = state.gpus[0].uuid
    t0 = max(state.now_s, state.free_at.get(u, state.now_s))
    ep = state.endpoints[next(iter(eps))] if batch else None
    old = state.resident.get(u)
    warm = ep is None or old == ep.name
    evicts = () if warm or old is None else (old,)
    load = 0.0 if warm else ep.cold_start_s + (state.endpoints[old].evict_s if old in state.endpoints else 0.0)
    base = t0 + load
    jobs = list(batch)
    p = [j.service_s for j in jobs]
    w = [j.weight for j in jobs]
    d = [(j.deadline_s - base) if j.deadline_s is not None else math.inf for j in jobs]
    res = solve_single_machine(p, w, d, time_limit_s=time_limit_s, seed=seed)
    out, t = [], base
    first = True
    for i in res.order:
        j = jobs[i]
        start = t - load if first else t
        out.append(Assignment(j.id, (u,), start, t, t + j.service_s, evicts if first else (),
                              "cold_start" if first and not warm else "warm"))
        t += j.service_s
        first = False
    wc = sum(jobs[i].weight * (a.end_s - jobs[i].release_s) for i, a in zip(res.order, out))
    return Plan("weighted-tardiness", out, res.value,
                {"weighted_tardiness": res.value, "weighted_completion": wc, "optimal": float(res.optimal)})
