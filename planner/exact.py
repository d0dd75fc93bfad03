"""Exact branch and bound for tiny batches (the planner's optimum on ≤ ``MAX_EXACT_JOBS`` jobs).

Searches every list schedule (a job order × a group per job, each job at its earliest
start through :class:`makespan.planner.replay.Replay`): for Σ w_j (C_j − r_j), a regular objective
with sequence-dependent transitions, some optimal schedule is such a list schedule
(list-schedule an optimal schedule's jobs in start order on the same groups: by induction
each starts no later, with the same residents). Pruning: partial cost + Σ over unplaced
jobs of w_j·(max(ready_j, now) + p_j − r_j) ≥ incumbent. Symmetry: hosts whose GPUs are
in identical states (resident, sleeping endpoints, free time, position by position) are
interchangeable, so only the first of them is branched on (exact). The search stops at
``node_limit`` nodes or ``time_limit_s`` wall seconds (then ``stats['exact']`` = 0 and the
best plan found, never worse than the incumbent, is returned).

With ``objective="weighted_tardiness"`` the searched cost is Σ w_j·max(0, C_j − d_j) +
ε·Σ w_j (C_j − r_j) (ε = :data:`makespan.planner.evaluator.TARDINESS_EPS`; the evaluator's score
less its future-cost term, as for weighted completion), also regular, so the same list
schedules suffice; the bound charges each unplaced job its cost at max(ready_j, now) + p_j.

The search leaves out the score's future cost and set-point cost
(``FleetState.set_point_weight`` > 0; both ≥ 0, so its bound stays a lower bound of the
score); the result is compared with the incumbent by the full score, so it is never
worse than it, but ``stats['exact']`` = 1 then means optimal for the searched cost only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from makespan.planner.evaluator import TARDINESS_EPS, evaluate, score
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.replay import Replay

MAX_EXACT_JOBS = 7


def _distinct_groups(rep: Replay, groups: list[tuple[str, ...]], host_of: dict[str, str],
                     host_gpus: dict[str, list[str]]) -> list[tuple[str, ...]]:
    """``groups`` less those on a host identical (GPU by GPU) to an earlier host."""
    sig: dict[str, tuple] = {}
    for h, us in host_gpus.items():
        sig[h] = tuple((rep.resident[u], rep.free_at[u], rep.asleep[u]) for u in us)
    first: dict[tuple, str] = {}
    for h in host_gpus:
        first.setdefault(sig[h], h)
    return [g for g in groups if first[sig[host_of[g[0]]]] == host_of[g[0]]]


def job_cost(objective: str):
    """(job, completion C_j in s) -> its term of the searched cost (module doc), weight·s."""
    if objective == "weighted_tardiness":
        def cost(j: PlanJob, end_s: float) -> float:
            t = j.weight * (end_s - j.deadline_s) if j.deadline_s is not None and end_s > j.deadline_s else 0.0
            return t + TARDINESS_EPS * j.weight * (end_s - j.release_s)
        return cost
    return lambda j, end_s: j.weight * (end_s - j.release_s)


def exact(batch: Sequence[PlanJob], state: FleetState, incumbent: Plan, node_limit: int = 2_000_000,
          time_limit_s: float | None = None, objective: str = "weighted_completion") -> Plan:
    """Best plan by exhaustive branch and bound, never worse than ``incumbent`` (evaluated
    for the same ``objective``). ``stats['exact']`` is 1.0 when the search finished (the
    plan is optimal)."""
    jobs = list(batch)
    jc = job_cost(objective)
    best_val = [incumbent.stats["weighted_tardiness"] + TARDINESS_EPS * incumbent.stats["weighted_completion"]
                if objective != "weighted_completion" else incumbent.objective]  # job_cost's sum, no future cost
    best_seq: list[list[tuple[PlanJob, tuple[str, ...]]]] = [[]]
    nodes = [0]
    ids = {j.id for j in jobs}
    deadline = time.perf_counter() + time_limit_s if time_limit_s is not None else float("inf")
    timed_out = [False]
    host_gpus = {h: [g.uuid for g in gs] for h, gs in state.hosts().items()}
    host_of = {u: h for h, us in host_gpus.items() for u in us}

    def dfs(rep: Replay, left: list[PlanJob], cost: float, seq: list[tuple[PlanJob, tuple[str, ...]]]) -> None:
        if not left:
            if cost < best_val[0] - 1e-9:
                best_val[0], best_seq[0] = cost, list(seq)
            return
        bound = cost + sum(jc(j, rep.ready(j) + j.service_s) for j in left)
        if bound >= best_val[0] - 1e-9 or nodes[0] > node_limit or timed_out[0]:
            return
        if time.perf_counter() > deadline:
            timed_out[0] = True
            return
        for i, j in enumerate(left):
            if any(d in ids and d not in rep.end_of for d in j.deps):
                continue
            for g in _distinct_groups(rep, rep.job_groups(j), host_of, host_gpus):
                nodes[0] += 1
                r2 = rep.copy()
                a = r2.place(j, g)
                seq.append((j, g))
                dfs(r2, left[:i] + left[i + 1:], cost + jc(j, a.end_s), seq)
                seq.pop()

    dfs(Replay(state), jobs, 0.0, [])
    if not best_seq[0]:
        out = Plan(incumbent.policy, list(incumbent.assignments), incumbent.objective, dict(incumbent.stats))
    else:
        rep = Replay(state)
        assigns: list[Assignment] = [rep.place(j, g) for j, g in best_seq[0]]
        out = evaluate(assigns, batch, state, incumbent.policy, objective=objective)
        if score(out) > score(incumbent):
            out = incumbent
    out.stats["exact"] = 1.0 if nodes[0] <= node_limit and not timed_out[0] else 0.0
    return out
