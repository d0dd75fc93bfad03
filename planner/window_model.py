"""The CP-SAT model of one LNS window of :mod:`makespan.planner.cpsat` (:func:`solve_window`).

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
    objective:   Σ w_j·C_j + 1 per transition second (a small cost per transition)
                 + the future cost of the endpoints in recent demand the window leaves
                 without instances (:mod:`makespan.planner.window_future`, an estimate of the
                 evaluator's term);
                 with ``objective="weighted_tardiness"``, 1000·Σ w_j·T_j (T_j ≥ C_j − d_j,
                 T_j ≥ 0, jobs with a deadline) is added: tardiness first, the
                 completion sum as tie-break (the evaluator's score decides acceptance);
                 with ``FleetState.set_point_weight`` > 0, a linear estimate of the
                 set-point absence caused by residencies that displace a resident
                 set-point instance (:mod:`makespan.planner.window_set_point`).
The incumbent window is given as a complete hint, built to satisfy the model (its jobs in
order on their groups at the earliest starts the model allows, :func:`hint_of`); with
``verify_hint`` it is also checked by fixing every hinted variable. Deterministic up to
the wall clock: fixed ``seed``, ``workers`` search workers (default 1); how far the search
gets depends on the time limit and the machine's speed.

With preemption candidates (``pre``, a window at the plan's first job only), the model
also holds the variables and constraints of :mod:`makespan.planner.window_preemption` (take a
candidate or not; victims kept until their end or restarted in the window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from makespan.planner import window_preemption as wp
from makespan.planner.window_future import FutureTerm
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.preemption_plan import Candidate
from makespan.planner.replay import Group, Replay
from makespan.planner.window_set_point import SetPointTerm


@dataclass
class Window:
    """A solved window: the model's job order and groups, whether CP-SAT proved it, the
    model objective and the incumbent's (the hint's; inf without a hint), and the replay
    after the prefix."""

    order: list[str]
    groups: dict[str, Group]
    optimal: bool
    objective: float
    hint_objective: float
    prefix: Replay
    taken: list[Candidate]


def hint_of(win: Sequence[Assignment], cands: dict[str, list[Group]], res: dict, x: dict, start: dict,
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


def solve_window(inc: Plan, lo: int, hi: int, jobs: dict[str, PlanJob], state: FleetState,
                  time_limit_s: float, seed: int, workers: int, max_groups: int,
                  verify_hint: bool, objective: str = "weighted_completion",
                  pre: Sequence[Candidate] = (), deterministic_s: float | None = None) -> Window | None:
    """Build and solve the model of ``inc.assignments[lo:hi]`` (module doc); ``pre``:
    preemption candidates to model (``lo`` = 0 only, :mod:`makespan.planner.window_preemption`).
    CP-SAT stops at ``time_limit_s`` wall seconds or, when given, ``deterministic_s`` of
    its deterministic time (a measure of work done, the same on a fast or a loaded host),
    whichever comes first; ``verify_hint``'s check of the hint gets 0.05 wall s, or with
    ``deterministic_s`` the same limits as the solve."""
    rep = Replay(state)
    for a in inc.assignments[:lo]:
        rep.place(jobs[a.job_id], a.gpus, a.start_s)
    win = inc.assignments[lo:hi]
    victims = {v.id: v for c in pre for v in c.victims}
    jobs = {**jobs, **{v.id: v.job for v in victims.values()}} if victims else jobs
    cut_gpus = {u for v in victims.values() for u in v.gpus}
    # a candidate's group may hold GPUs that are free now (a partly free group, issue 19): in the model too
    gpus = {u for a in win for u in a.gpus} | cut_gpus | {u for c in pre for u in c.group}
    t0 = state.now_s
    eps = state.endpoints

    def ti(x: float) -> int:
        return int(math.ceil(x - t0 - 1e-9))

    def free0(g: Group) -> int:  # when g's GPUs are free, a victim's GPU at 0 (it may be cut)
        return max(0, max(0 if u in cut_gpus else ti(rep.free_at[u]) for u in g))

    cands: dict[str, list[Group]] = {}
    for jid, own in [(a.job_id, tuple(a.gpus)) for a in win] + [(v.id, None) for v in victims.values()]:
        ep = eps[jobs[jid].endpoint]
        gs = [g for g in rep.groups(ep) if set(g) <= gpus and g != own]
        gs.sort(key=lambda g: (not all(rep.resident[u] == ep.name for u in g), rep.group_free(g)))
        cands[jid] = ([own] if own else []) + gs[:max_groups - (1 if own else 0)]
    for c in pre:
        if c.group not in cands[c.job.id]:
            cands[c.job.id].append(c.group)
    horizon = ti(max([a.end_s for a in win] + [v.end_s for v in victims.values()])) + sum(
        int(math.ceil(v.job.service_s)) for v in victims.values()) + int(
        max(e.cold_start_s + e.evict_s for e in eps.values())) * 2 * (1 + len(victims)) + 10
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
            s = m.NewIntVar(free0(g), horizon, "")
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
    pv = wp.Holders(m, pre, victims, ti, by_gpu_job)
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
        end = pv.completion(m, jid, lits, s, pj, horizon, ti) if jid in victims else s + pj
        if jid not in victims:
            m.AddExactlyOne(lits)
        for d in j.deps:
            if d in start:
                m.Add(s >= start[d] + int(math.ceil(jobs[d].service_s)))
        wj[jid] = (int(round(j.weight * 10)), pj)
        obj.append(wj[jid][0] * end)
        if objective == "weighted_tardiness" and j.deadline_s is not None:
            due[jid] = int(math.floor(j.deadline_s - t0))
            late = m.NewIntVar(0, horizon + max(0, -due[jid]), "")  # a deadline already past: late > horizon
            m.Add(late >= end - due[jid])
            obj.append(1000 * wj[jid][0] * late)
    pv.link(m, res, x, start)
    for u in gpus:
        m.AddNoOverlap([res[k][3] for k in by_gpu_res[u]] + pv.occupied.get(u, []))
        m.AddNoOverlap(by_gpu_job[u])
    obj.extend(v[0] * v[4] for v in res.values())
    fut = FutureTerm(m, inc.assignments[hi:], jobs, state, rep, res, gpus)
    obj.extend(c * v for c, v in fut.terms)
    spt = SetPointTerm(m, res, rep, state, horizon)  # set_point_weight > 0 only (an estimate)
    obj.extend(spt.objective())
    m.Minimize(sum(obj))
    hint = hint_of(win, cands, res, x, start, jobs, rep, ti)
    fut_hint = 0
    if hint is not None and pre:
        hint += pv.hint(x, cands, start, ti)
    if hint is not None and fut.terms:
        more, fut_hint = fut.hint(dict(hint))
        hint += more
    if hint is not None and spt.items:
        hint += spt.hint(dict(hint))
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
        if deterministic_s is None:
            prm.max_time_in_seconds = min(0.05, time_limit_s)
        else:  # bounded by work: the check too, so that a loaded host cannot end it first
            prm.max_time_in_seconds = max(0.01, time_limit_s)
            prm.max_deterministic_time = deterministic_s
        ok = solver.Solve(fixed) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        if ok:
            for v, val in hint:
                m.AddHint(v, val)
    else:
        for v, val in hint:
            m.AddHint(v, val)
    prm.max_time_in_seconds = max(0.01, time_limit_s)
    if deterministic_s is not None:
        prm.max_deterministic_time = deterministic_s
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    taken = [c for c, y in zip(pre, pv.y) if solver.Value(y)]
    cut = {v.id for c in taken for v in c.victims}
    placed = [jid for jid in cands if jid not in victims or jid in cut]
    groups = {jid: next(g for g in cands[jid] if solver.Value(x[(jid, g)])) for jid in placed}
    order = sorted(placed, key=lambda jid: (solver.Value(start[jid]), jid))
    hint_obj = math.inf
    if hint is not None:
        hv = dict(hint)

        def end_h(jid: str) -> int:  # completion in the hint (a kept victim: its own end)
            return ti(victims[jid].end_s) if jid in victims else hv[start[jid]] + wj[jid][1]

        hint_obj = (sum(c * end_h(jid) for jid, (c, _pj) in wj.items())
                    + sum(v[4] * hv[v[0]] for v in res.values())
                    + sum(1000 * wj[jid][0] * max(0, end_h(jid) - d) for jid, d in due.items())
                    + fut_hint + (spt.value(hv) if spt.items else 0))
    return Window(order, groups, st == cp_model.OPTIMAL, solver.ObjectiveValue(), hint_obj, rep, taken)
