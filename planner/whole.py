"""One CP-SAT model for a whole small batch, so that "optimal" means the whole plan.

Applies to batches of at most :data:`MAX_WHOLE_JOBS` jobs whose endpoints all run on
one GPU (TP 1) and have no sleep mode (:func:`applicable`); the windowed improver
(:mod:`makespan.planner.cpsat`) handles the rest and proves nothing about a whole plan.

Model — a relaxation of the replay (integer units of ``1/scale`` s, 0 = planning time):
    data:        per job j: ready time a_j (release, now, dependencies outside the batch),
                 service p_j, weight w_j, endpoint e_j; per GPU u: free time f_u and
                 resident endpoint r_u; transition σ(x, y) = 0 if x = y, else evict_s(x) +
                 cold_start_s(y) (Replay's rule on one GPU; σ obeys the triangle inequality);
    variables:   service start S_j (C_j = S_j + p_j), earliest take R_j ≥ a_j, GPU literals,
                 per pair "same GPU" and "i before j" literals, warm_j;
    constraints: one GPU per job; on u: S_j ≥ f_u + σ(r_u, e_j); a pair on one GPU is
                 ordered with S_j ≥ C_i + σ(e_i, e_j) (valid for any two jobs of a GPU's
                 sequence by the triangle inequality); R_j ≥ C_d for in-batch dependencies;
                 unless warm_j, S_j ≥ R_j + the smallest evict that can precede j + cold
                 start of e_j; warm_j only if u holds e_j at the start or a job of e_j is
                 before j on u; service intervals of a GPU do not overlap;
    objective:   Σ w_j·C_j (weights as integers).

Proof. Every plan the replay can produce is a solution (when every datum lies on the
unit), so the model's optimum is a lower bound on the best plan. The solution is decoded
(GPU per job, service-start order) and replayed at earliest starts through
:class:`makespan.planner.replay.Replay` and scored by :func:`makespan.planner.evaluator.evaluate`. When
CP-SAT proves OPTIMAL and the decoded plan's Σ w_j (C_j − r_j) equals the model optimum
(converted: objective / scale − Σ w_j (r_j − now)), the plan is optimal: lower bound =
plan. Otherwise (a relaxed solution the replay cannot realise, or data off every unit of
1, 0.1, 0.01 and 0.001 s — then rounded up, ``exact_data`` 0) it is not called optimal.

Determinism: ``random_seed`` is fixed; with one search worker the search is
deterministic; with several, the objective of a proven result is the same on every run
(it is the optimum), while the plan returned among equal-cost plans may differ.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from makespan.planner.evaluator import evaluate
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.planner.replay import Replay

MAX_WHOLE_JOBS = 40
SCALES = (1, 10, 100, 1000)


def applicable(batch: Sequence[PlanJob], state: FleetState) -> bool:
    """True if :func:`solve` models ``batch`` exactly (size, TP 1, no sleep mode, every job
    free to take any GPU: no ``hosts``)."""
    if not 1 <= len(batch) <= MAX_WHOLE_JOBS:
        return False
    eps = state.endpoints
    return all(j.endpoint in eps and eps[j.endpoint].tp == 1 and eps[j.endpoint].wake_s is None and not j.hosts
               and all(g.memory_mib >= eps[j.endpoint].memory_mib for g in state.gpus) for j in batch)


def search_workers(requested: int) -> int:
    """CP-SAT search workers used for ``requested``: at most the machine's cores (more
    threads than cores share them and prove the whole-batch optimum later, not sooner)."""
    return max(1, min(requested, os.cpu_count() or 1))


def _scale(values: list[float]) -> tuple[int, bool]:
    """The coarsest unit (as 1/scale s) on which every value lies, and whether one does."""
    for s in SCALES:
        if all(abs(v * s - round(v * s)) <= 1e-6 for v in values):
            return s, True
    return SCALES[-1], False


@dataclass
class _Data:
    jobs: list[PlanJob]
    gpus: list[str]
    ready: list[int]
    free: list[int]
    resident: list[str | None]
    scale: int
    wscale: int
    exact: bool
    sigma: Callable[[str | None, str], int]
    up: Callable[[float], int]


def _data(batch: Sequence[PlanJob], state: FleetState) -> _Data:
    eps, now = state.endpoints, state.now_s
    jobs = list(batch)
    ids = {j.id for j in jobs}
    rep = Replay(state)
    ready = [max(j.release_s, now, *[state.end_of.get(d, now) for d in j.deps if d not in ids]) - now for j in jobs]
    gpus = [g.uuid for g in state.gpus]
    free = [rep.free_at[u] - now for u in gpus]
    used = {j.endpoint for j in jobs} | {r for r in rep.resident.values() if r is not None and r in eps}
    raw = ready + [j.service_s for j in jobs] + free + [eps[e].evict_s for e in used] + [eps[e].cold_start_s for e in used]
    scale, exact = _scale(raw)
    wts = [j.weight for j in jobs]
    wscale = 1 if all(abs(w - round(w)) <= 1e-9 for w in wts) else 1000
    exact = exact and all(abs(w * wscale - round(w * wscale)) <= 1e-6 for w in wts)

    def up(x: float) -> int:
        return int(math.ceil(x * scale - 1e-6))

    def sigma(prev: str | None, name: str) -> int:
        if prev == name:
            return 0
        return (up(eps[prev].evict_s) if prev is not None and prev in eps else 0) + up(eps[name].cold_start_s)

    return _Data(jobs, gpus, [up(x) for x in ready], [up(x) for x in free], [rep.resident[u] for u in gpus],
                 scale, wscale, exact, sigma, up)


def _model(d: _Data, state: FleetState) -> tuple[cp_model.CpModel, list, dict]:
    """Variables, constraints and objective (module doc). Returns (model, S, GPU literals)."""
    eps = state.endpoints
    jobs, n, ng, up, sigma = d.jobs, len(d.jobs), len(d.gpus), d.up, d.sigma
    ev_max = max((up(x.evict_s) for x in eps.values()), default=0)  # bounds every list schedule's end
    horizon = max(d.ready + d.free) + sum(up(j.service_s) + ev_max + up(eps[j.endpoint].cold_start_s) for j in jobs)
    m = cp_model.CpModel()
    idx = {j.id: i for i, j in enumerate(jobs)}
    e = [j.endpoint for j in jobs]
    p = [up(j.service_s) for j in jobs]
    start = [m.NewIntVar(d.ready[i], horizon, f"S{i}") for i in range(n)]
    comp = [m.NewIntVar(0, horizon, f"C{i}") for i in range(n)]
    rdy = [m.NewIntVar(d.ready[i], horizon, f"R{i}") for i in range(n)]
    on = {(i, k): m.NewBoolVar(f"on{i}_{k}") for i in range(n) for k in range(ng)}
    warm = [m.NewBoolVar(f"w{i}") for i in range(n)]
    warm_why: list[list] = [[] for _ in range(n)]
    for i, j in enumerate(jobs):
        m.Add(comp[i] == start[i] + p[i])
        m.Add(start[i] >= rdy[i])
        m.AddExactlyOne(on[(i, k)] for k in range(ng))
        for dep in j.deps:
            if dep in idx:
                m.Add(rdy[i] >= comp[idx[dep]])
        others = {x for x in e if x != e[i]}
        for k in range(ng):
            r = d.resident[k]
            m.Add(start[i] >= d.free[k] + sigma(r, e[i])).OnlyEnforceIf(on[(i, k)])
            if r == e[i]:
                warm_why[i].append(on[(i, k)])
            prev = others | ({r} if r != e[i] else set())
            ev_min = min((up(eps[x].evict_s) if x is not None and x in eps else 0 for x in prev), default=0)
            m.Add(start[i] >= rdy[i] + ev_min + up(eps[e[i]].cold_start_s)).OnlyEnforceIf([on[(i, k)], warm[i].Not()])
    for i in range(n):
        for j in range(i + 1, n):
            sg = m.NewBoolVar("")  # i and j on the same GPU
            for k in range(ng):
                m.AddBoolOr([on[(i, k)].Not(), on[(j, k)].Not(), sg])
                m.AddImplication(on[(i, k)], on[(j, k)]).OnlyEnforceIf(sg)
            bij = m.NewBoolVar("")  # i before j
            m.Add(start[j] >= comp[i] + sigma(e[i], e[j])).OnlyEnforceIf([sg, bij])
            m.Add(start[i] >= comp[j] + sigma(e[j], e[i])).OnlyEnforceIf([sg, bij.Not()])
            if e[i] == e[j]:  # a same-endpoint job before it on its GPU may make it warm
                for b, lit in ((j, bij), (i, bij.Not())):
                    pw = m.NewBoolVar("")
                    m.AddImplication(pw, sg)
                    m.AddImplication(pw, lit)
                    warm_why[b].append(pw)
    for k in range(ng):
        m.AddNoOverlap([m.NewOptionalFixedSizeIntervalVar(start[i], p[i], on[(i, k)], "") for i in range(n)])
    for i in range(n):
        m.AddBoolOr(warm_why[i] + [warm[i].Not()])
    m.Minimize(sum(int(round(j.weight * d.wscale)) * c for j, c in zip(jobs, comp)))
    return m, start, on


def solve(batch: Sequence[PlanJob], state: FleetState, hint: Plan | None = None, time_limit_s: float = 1.0,
          seed: int = 0, workers: int = 1, deterministic_s: float | None = None) -> Plan | None:
    """Solve ``batch`` as one model (module doc); ``batch`` must be :func:`applicable`.

    Args:
        hint: an evaluated plan of the batch (the greedy floor), given to CP-SAT as a hint.
        time_limit_s: CP-SAT wall-time limit, s.
        seed: CP-SAT ``random_seed``.
        workers: requested search workers (:func:`search_workers` are used).
        deterministic_s: when given, CP-SAT also stops after this much deterministic
            time (its measure of work done, the same on a fast or a loaded host; with
            one worker the whole search is then reproducible), deterministic s.

    Returns:
        the decoded, evaluated plan (policy "cpsat"), or None when CP-SAT found no
        solution in time. Stats: ``search_workers``; ``whole_status`` (CP-SAT status: 4
        OPTIMAL, 2 FEASIBLE); ``whole_objective`` and ``whole_bound`` (the model's objective
        and lower bound as Σ w_j (C_j − r_j), weight·s); ``exact_data`` (1 if every datum
        lies on the unit); ``proven_optimal`` (1 iff OPTIMAL, exact data and the plan's
        objective equals ``whole_objective`` within 1e-6 relative).
    """
    d = _data(batch, state)
    m, start, on = _model(d, state)
    ng = len(d.gpus)
    if hint is not None:
        by = hint.by_job()
        k_of = {u: k for k, u in enumerate(d.gpus)}
        for i, j in enumerate(d.jobs):
            m.AddHint(start[i], d.up(by[j.id].service_start_s - state.now_s))
            for k in range(ng):
                m.AddHint(on[(i, k)], int(k == k_of[by[j.id].gpus[0]]))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_workers = search_workers(workers)
    prm.max_time_in_seconds = max(0.01, time_limit_s)
    if deterministic_s is not None:
        prm.max_deterministic_time = deterministic_s
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    n = len(d.jobs)
    order = sorted(range(n), key=lambda i: (solver.Value(start[i]), i))
    gpu_of = {i: next(d.gpus[k] for k in range(ng) if solver.Value(on[(i, k)])) for i in range(n)}
    rep = Replay(state)
    plan = evaluate([rep.place(d.jobs[i], (gpu_of[i],)) for i in order], batch, state, "cpsat")
    const = sum(j.weight * (j.release_s - state.now_s) for j in d.jobs)
    unit = d.scale * d.wscale
    model_obj = solver.ObjectiveValue() / unit - const
    same = abs(plan.objective - model_obj) <= 1e-6 * max(1.0, abs(model_obj))
    plan.stats.update({"search_workers": float(prm.num_workers), "whole_status": float(st),
                       "whole_objective": model_obj, "whole_bound": solver.BestObjectiveBound() / unit - const,
                       "exact_data": float(d.exact),
                       "proven_optimal": float(st == cp_model.OPTIMAL and d.exact and same)})
    return plan
