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
from typing import NamedTuple

from ortools.sat.python import cp_model

from makespan.planner import window_preemption as wp
from makespan.planner.helpers import held_s
from makespan.planner.window_future import FutureTerm
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob, RunningJob
from makespan.planner.preemption_plan import Candidate
from makespan.planner.replay import Group, Replay
from makespan.planner.window_set_point import SetPointTerm


TARDINESS_WEIGHT = 1000  # weight of Σ w_j·T_j against Σ w_j·C_j with objective="weighted_tardiness"


class Residency(NamedTuple):
    """The variables of "model m resident on group g", R[g,m] of the module doc. A tuple
    whose fields the window terms (:mod:`makespan.planner.window_future`,
    :mod:`makespan.planner.window_set_point`, :mod:`makespan.planner.window_preemption`)
    read by position: (present, start, end, interval, σ, warm)."""

    present: cp_model.IntVar  # literal: the residency is in the solution
    start: cp_model.IntVar  # model time, s
    end: cp_model.IntVar  # model time, s
    interval: cp_model.IntervalVar  # optional, present iff ``present``
    transition_s: int  # σ[g,m]: its first seconds are the transition (0 when warm)
    warm: bool  # g already holds m: it comes first on g


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
    eps = rep.endpoints
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
                 [hinted_start.get(d, 0) + int(math.ceil(held_s(jobs[d], eps))) for d in j.deps if d in start])
        end = s0 + int(math.ceil(held_s(j, eps)))
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
    """Build and solve the model of ``inc.assignments[lo:hi]`` (module doc).

    Args:
        inc: the incumbent plan; its assignments before ``lo`` are fixed, those from ``hi``
            on feed the future-cost estimate.
        lo, hi: the window, indices into ``inc.assignments``.
        jobs: job id -> job, every job of ``inc``.
        state: the fleet at planning time (``now_s`` is the model's time 0).
        time_limit_s: CP-SAT's limit for this window, wall s.
        seed, workers: CP-SAT's ``random_seed`` and ``num_search_workers``.
        max_groups: candidate groups per job (its incumbent group included).
        verify_hint: check the hint by solving the model with it fixed first.
        objective: "weighted_completion" or "weighted_tardiness" (module doc).
        pre: preemption candidates to model (``lo`` = 0 only,
            :mod:`makespan.planner.window_preemption`).
        deterministic_s: when given, CP-SAT also stops after this much deterministic
            time (a measure of work done, the same on a fast or a loaded host), and
            ``verify_hint``'s check gets the same limits instead of 0.05 wall s.

    Returns:
        the solved :class:`Window`, or None when CP-SAT finds no solution in the limit.
    """
    data = _window_data(inc, lo, hi, jobs, state, max_groups, pre)
    model = cp_model.CpModel()
    residencies, residencies_by_gpu = _add_residencies(model, data)
    _serve_warm_models_first(model, residencies)
    job_vars = _add_jobs(model, data, residencies, objective, pre)
    job_vars.holders.link(model, residencies, job_vars.on_group, job_vars.start)
    for gpu in data.gpus:
        model.add_no_overlap([residencies[key].interval for key in residencies_by_gpu[gpu]]
                           + job_vars.holders.occupied.get(gpu, []))
        model.add_no_overlap(job_vars.intervals_by_gpu[gpu])
    objective_terms = job_vars.objective_terms
    objective_terms.extend(residency.present * residency.transition_s for residency in residencies.values())
    future = FutureTerm(model, inc.assignments[hi:], data.jobs, state, data.replay, residencies, data.gpus)
    objective_terms.extend(coefficient * variable for coefficient, variable in future.terms)
    set_point = SetPointTerm(model, residencies, data.replay, state, data.horizon)  # set_point_weight > 0 only
    objective_terms.extend(set_point.objective())
    model.minimize(sum(objective_terms))
    hint, future_hint = _hint(data, residencies, job_vars, future, set_point, pre)
    solver = cp_model.CpSolver()
    status = _solve(model, solver, hint, seed, workers, time_limit_s, verify_hint, deterministic_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return _decode(solver, status, data, residencies, job_vars, hint, future_hint, set_point, pre)


@dataclass
class _WindowData:
    """The data of one window (module doc, "data"); model times are integer seconds from
    ``now_s``."""

    replay: Replay  # the fleet after the plan's assignments before the window
    window: list[Assignment]
    jobs: dict[str, PlanJob]  # the plan's jobs and the preemption candidates' victims
    victims: dict[str, RunningJob]  # victim id -> the running job a candidate would cut
    cut_gpus: set[str]  # GPUs of the victims (free at 0 in the model: they may be cut)
    gpus: set[str]  # every GPU the window's jobs and candidates may use
    now_s: float
    candidates: dict[str, list[Group]]  # job id -> its candidate groups, the incumbent's first
    horizon: int  # upper bound of every model time

    def model_time(self, time_s: float) -> int:
        """``time_s`` (planning-clock s) as a model time: whole seconds from ``now_s``, rounded up."""
        return int(math.ceil(time_s - self.now_s - 1e-9))

    def group_free_at(self, group: Group) -> int:
        """Model time when ``group``'s GPUs are free (a victim's GPU at 0: it may be cut)."""
        return max(0, max(0 if gpu in self.cut_gpus else self.model_time(self.replay.free_at[gpu]) for gpu in group))


def _window_data(inc: Plan, lo: int, hi: int, jobs: dict[str, PlanJob], state: FleetState, max_groups: int,
                 pre: Sequence[Candidate]) -> _WindowData:
    replay = Replay(state)
    for assignment in inc.assignments[:lo]:
        replay.place(jobs[assignment.job_id], assignment.gpus, assignment.start_s)
    window = inc.assignments[lo:hi]
    victims = {victim.id: victim for candidate in pre for victim in candidate.victims}
    jobs = {**jobs, **{victim.id: victim.job for victim in victims.values()}} if victims else jobs
    cut_gpus = {gpu for victim in victims.values() for gpu in victim.gpus}
    # a candidate's group may hold GPUs that are free now (a partly free group, issue 19): in the model too
    gpus = ({gpu for assignment in window for gpu in assignment.gpus} | cut_gpus
            | {gpu for candidate in pre for gpu in candidate.group})
    endpoints = state.endpoints
    candidates: dict[str, list[Group]] = {}
    placed = [(assignment.job_id, tuple(assignment.gpus)) for assignment in window]
    for job_id, own in placed + [(victim.id, None) for victim in victims.values()]:
        endpoint = endpoints[jobs[job_id].endpoint]
        others = [group for group in replay.job_groups(jobs[job_id]) if set(group) <= gpus and group != own]
        others.sort(key=lambda group: (not all(replay.resident[gpu] == endpoint.name for gpu in group),
                                       replay.group_free(group)))
        candidates[job_id] = ([own] if own else []) + others[:max_groups - (1 if own else 0)]
    for candidate in pre:
        if candidate.group not in candidates[candidate.job.id]:
            candidates[candidate.job.id].append(candidate.group)
    data = _WindowData(replay, window, jobs, victims, cut_gpus, gpus, state.now_s, candidates, horizon=0)
    last_end = data.model_time(max([a.end_s for a in window] + [victim.end_s for victim in victims.values()]))
    restarted_s = sum(int(math.ceil(victim.job.service_s)) for victim in victims.values())
    slowest_transition_s = int(max(e.cold_start_s + e.evict_s for e in endpoints.values()))
    data.horizon = last_end + restarted_s + slowest_transition_s * 2 * (1 + len(victims)) + 10
    return data


def _group_name(group: Group) -> str:
    return "+".join(group)


def _add_residencies(model: cp_model.CpModel, data: _WindowData) -> tuple[dict[tuple[Group, str], Residency],
                                                                            dict[str, list[tuple[Group, str]]]]:
    """R[g,m] and σ[g,m] (module doc) for each job's candidate groups and model; returns
    them by (group, endpoint) and those keys by GPU."""
    residencies: dict[tuple[Group, str], Residency] = {}
    by_gpu: dict[str, list[tuple[Group, str]]] = {gpu: [] for gpu in data.gpus}
    for job_id, groups in data.candidates.items():
        name = data.jobs[job_id].endpoint
        for group in groups:
            if (group, name) in residencies:
                continue
            warm = all(data.replay.resident[gpu] == name for gpu in group)
            transition_s = 0 if warm else _transition_s(data, group, name)
            label = f"{name}@{_group_name(group)}"
            present = model.new_bool_var(f"resident[{label}]")
            start = model.new_int_var(data.group_free_at(group), data.horizon, f"resident_start[{label}]")
            end = model.new_int_var(0, data.horizon, f"resident_end[{label}]")
            length = model.new_int_var(0, data.horizon, f"resident_length[{label}]")
            interval = model.new_optional_interval_var(start, length, end, present, f"residency[{label}]")
            residencies[(group, name)] = Residency(present, start, end, interval, transition_s, warm)
            for gpu in group:
                by_gpu[gpu].append((group, name))
    return residencies, by_gpu


def _transition_s(data: _WindowData, group: Group, name: str) -> int:
    """σ[g,m] of a group that does not hold ``name``: the largest evict among its residents
    and the window's endpoints, + wake (asleep on every GPU of it at the window's start:
    the wake of the level it sleeps at, as the replay times it) or cold start; s. A model
    that a job inside the window puts to sleep is priced as a cold start when loaded again
    in the same window (the window's residencies do not model sleeps they cause; the
    decoded plan is re-timed by the replay, which wakes it)."""
    endpoints = data.replay.endpoints
    endpoint = endpoints[name]
    evict_s = max((endpoints[resident].evict_s for gpu in group for resident in [data.replay.resident[gpu]]
                   if resident in endpoints), default=0.0)
    evict_s = max([evict_s] + [endpoints[data.jobs[job_id].endpoint].evict_s for job_id in data.candidates])
    if endpoint.wake_s is not None and all(name in data.replay.asleep[gpu] for gpu in group):
        load_s = data.replay.group_wake_s(group, endpoint)  # asleep on every GPU of the group: its level's wake
    else:
        load_s = endpoint.cold_start_s
    return int(math.ceil(evict_s + load_s))


def _serve_warm_models_first(model: cp_model.CpModel, residencies: dict[tuple[Group, str], Residency]) -> None:
    """A resident model is served first on its group, before anything evicts it."""
    for (group, name), residency in residencies.items():
        if not residency.warm:
            continue
        for (other_group, other_name), other in residencies.items():
            if other_name != name and set(other_group) & set(group):
                model.add(other.start >= residency.end).only_enforce_if([residency.present, other.present])


@dataclass
class _JobVars:
    """The jobs' variables and objective terms (module doc, "variables", "objective")."""

    on_group: dict[tuple[str, Group], cp_model.IntVar]  # (job id, group) -> presence literal
    start: dict[str, cp_model.IntVar]  # job id -> start, model time
    intervals_by_gpu: dict[str, list[cp_model.IntervalVar]]
    objective_terms: list
    weight_and_length: dict[str, tuple[int, int]]  # job id -> (10·weight rounded, service s rounded up)
    due: dict[str, int]  # model due time of jobs with a deadline (weighted tardiness)
    holders: wp.Holders


def _add_jobs(model: cp_model.CpModel, data: _WindowData, residencies: dict[tuple[Group, str], Residency],
              objective: str, pre: Sequence[Candidate]) -> _JobVars:
    intervals_by_gpu: dict[str, list] = {gpu: [] for gpu in data.gpus}
    job_vars = _JobVars({}, {}, intervals_by_gpu, [], {}, {},
                        wp.Holders(model, pre, data.victims, data.model_time, intervals_by_gpu))
    for job_id, groups in data.candidates.items():
        job = data.jobs[job_id]
        length = int(math.ceil(held_s(job, data.replay.endpoints)))  # helpers' start included
        start = model.new_int_var(max(0, data.model_time(data.replay.ready(job))), data.horizon, f"start[{job_id}]")
        job_vars.start[job_id] = start
        literals = []
        for group in groups:
            label = f"{job_id}@{_group_name(group)}"
            on_group = model.new_bool_var(f"on[{label}]")
            literals.append(on_group)
            job_vars.on_group[(job_id, group)] = on_group
            residency = residencies[(group, job.endpoint)]
            model.add_implication(on_group, residency.present)
            model.add(start >= residency.start + residency.transition_s).only_enforce_if(on_group)
            model.add(start + length <= residency.end).only_enforce_if(on_group)
            interval = model.new_optional_fixed_size_interval_var(start, length, on_group, f"run[{label}]")
            for gpu in group:
                intervals_by_gpu[gpu].append(interval)
        if job_id in data.victims:
            end = job_vars.holders.completion(model, job_id, literals, start, length, data.horizon, data.model_time)
        else:
            end = start + length
            model.add_exactly_one(literals)
        for dependency in job.deps:
            if dependency in job_vars.start:
                model.add(start >= job_vars.start[dependency] + int(math.ceil(held_s(data.jobs[dependency], data.replay.endpoints))))
        weight = int(round(job.weight * 10))
        job_vars.weight_and_length[job_id] = (weight, length)
        job_vars.objective_terms.append(weight * end)
        if objective == "weighted_tardiness" and job.deadline_s is not None \
                and job.deadline_s - data.now_s < data.horizon:  # due at or past the horizon: never late here
            # (and a far due time, 9.3e18 s and more, is no 64-bit integer: CP-SAT refused the model)
            due = job_vars.due[job_id] = int(math.floor(job.deadline_s - data.now_s))
            # a deadline already past: lateness above the horizon
            lateness = model.new_int_var(0, data.horizon + max(0, -due), f"late[{job_id}]")
            model.add(lateness >= end - due)
            job_vars.objective_terms.append(TARDINESS_WEIGHT * weight * lateness)
    return job_vars


def _hint(data: _WindowData, residencies: dict[tuple[Group, str], Residency], job_vars: _JobVars,
          future: FutureTerm, set_point: SetPointTerm,
          pre: Sequence[Candidate]) -> tuple[list[tuple[object, int]] | None, int]:
    """The incumbent as a complete hint (:func:`hint_of` and each term's part), and the
    future term's value in it; (None, 0) when the model cannot express the incumbent."""
    hint = hint_of(data.window, data.candidates, residencies, job_vars.on_group, job_vars.start, data.jobs,
                   data.replay, data.model_time)
    future_hint = 0
    if hint is not None and pre:
        hint += job_vars.holders.hint(job_vars.on_group, data.candidates, job_vars.start, data.model_time)
    if hint is not None and future.terms:
        more, future_hint = future.hint(dict(hint))
        hint += more
    if hint is not None and set_point.items:
        hint += set_point.hint(dict(hint))
    return hint, future_hint


def _solve(model: cp_model.CpModel, solver: cp_model.CpSolver, hint: list[tuple[object, int]] | None, seed: int,
           workers: int, time_limit_s: float, verify_hint: bool, deterministic_s: float | None = None) -> int:
    """Solve with the hint (checked first with ``verify_hint``: kept only when the model
    with it fixed is feasible within 0.05 s); returns CP-SAT's status."""
    parameters = solver.parameters
    parameters.random_seed = seed
    parameters.num_search_workers = workers
    parameters.cp_model_probing_level = 0
    if hint is not None and verify_hint:
        fixed = model.clone()
        for variable, value in hint:
            fixed.add(variable == value)  # type: ignore[operator]
        if deterministic_s is None:
            parameters.max_time_in_seconds = min(0.05, time_limit_s)
        else:  # bounded by work: the check too, so that a loaded host cannot end it first
            parameters.max_time_in_seconds = max(0.01, time_limit_s)
            parameters.max_deterministic_time = deterministic_s
        if solver.Solve(fixed) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            for variable, value in hint:
                model.add_hint(variable, value)
    elif hint is not None:
        for variable, value in hint:
            model.add_hint(variable, value)
    parameters.max_time_in_seconds = max(0.01, time_limit_s)
    if deterministic_s is not None:
        parameters.max_deterministic_time = deterministic_s
    return solver.Solve(model)


def _decode(solver: cp_model.CpSolver, status: int, data: _WindowData,
            residencies: dict[tuple[Group, str], Residency], job_vars: _JobVars,
            hint: list[tuple[object, int]] | None, future_hint: int, set_point: SetPointTerm,
            pre: Sequence[Candidate]) -> Window:
    """The :class:`Window` of a solution, with the hint's model objective (inf without one)."""
    taken = [candidate for candidate, chosen in zip(pre, job_vars.holders.y) if solver.Value(chosen)]
    cut = {victim.id for candidate in taken for victim in candidate.victims}
    placed = [job_id for job_id in data.candidates if job_id not in data.victims or job_id in cut]
    groups = {job_id: next(group for group in data.candidates[job_id]
                           if solver.Value(job_vars.on_group[(job_id, group)]))
              for job_id in placed}
    order = sorted(placed, key=lambda job_id: (solver.Value(job_vars.start[job_id]), job_id))
    hint_objective = math.inf
    if hint is not None:
        hinted = dict(hint)

        def hinted_end(job_id: str) -> int:  # completion in the hint (a kept victim: its own end)
            if job_id in data.victims:
                return data.model_time(data.victims[job_id].end_s)
            return hinted[job_vars.start[job_id]] + job_vars.weight_and_length[job_id][1]

        weights = job_vars.weight_and_length
        hint_objective = (sum(weight * hinted_end(job_id) for job_id, (weight, _length) in weights.items())
                          + sum(residency.transition_s * hinted[residency.present] for residency in residencies.values())
                          + sum(TARDINESS_WEIGHT * weights[job_id][0] * max(0, hinted_end(job_id) - due)
                                for job_id, due in job_vars.due.items())
                          + future_hint + (set_point.value(hinted) if set_point.items else 0))
    return Window(order, groups, status == cp_model.OPTIMAL, solver.ObjectiveValue(), hint_objective, data.replay, taken)
