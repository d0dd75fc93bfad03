"""List scheduling: place jobs one by one, in a given order, on the GPU group that
completes each earliest, paying transitions (evict + cold start) where needed.

This is the construction every greedy policy shares; the order (and the group rule)
is what distinguishes them. Graham-style list scheduling; with the WSPT order
(Smith 1956, "Various optimizers for single-stage production") it is the classic
weighted-completion heuristic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from makespan.planner.evaluator import TARDINESS_EPS
from makespan.planner.model import Assignment, EndpointModel, FleetState, Plan, PlanJob
from makespan.planner.replay import Replay


def transition(state_resident: dict[str, str | None], group: Sequence[str],
               ep: EndpointModel, endpoints: dict[str, EndpointModel]) -> tuple[float, tuple[str, ...], str]:
    """Transition time (s), evicted endpoints and load kind to run ``ep`` on ``group``.

    Evicts of distinct resident endpoints run in parallel (their max counts); the
    cold start follows them. A group whose every GPU already holds ``ep`` is warm."""
    residents = [state_resident.get(u) for u in group]
    if all(r == ep.name for r in residents):
        return 0.0, (), "warm"
    evicted = tuple(sorted({r for r in residents if r is not None and r != ep.name}))
    # A partially resident ep (other GPUs of the group hold something else) must reload.
    also = tuple(sorted({r for r in residents if r == ep.name}))
    evicted = tuple(sorted(set(evicted) | set(also)))
    evict_s = max((endpoints[r].evict_s for r in evicted if r in endpoints), default=0.0)
    return evict_s + ep.cold_start_s, evicted, "cold_start"


GroupRule = Callable[[PlanJob, list[tuple[str, ...]], dict[str, float], dict[str, str | None]], tuple[str, ...]]


def list_schedule(policy: str, order: Sequence[PlanJob], state: FleetState,
                  group_rule: GroupRule | None = None) -> Plan:
    """Place ``order`` one job at a time. Returns a complete :class:`Plan`.

    ``group_rule(job, candidates, free_at, resident)`` picks the group; by default the
    one with the earliest completion (ties: lowest transition, then fleet order).
    Jobs whose dependencies are not in the batch nor in ``state.end_of``/``state.done``
    are placed as if their dependencies were complete now."""
    rep = Replay(state)
    out: list[Assignment] = []
    for job in order:
        ep = state.endpoints[job.endpoint]
        cands = rep.job_groups(job)
        if not cands:
            raise ValueError(f"job {job.id}: no GPU group fits endpoint {ep.name}")
        ready = rep.ready(job)
        if group_rule is not None:
            grp = group_rule(job, cands, rep.free_at, rep.resident)
        else:
            grp = min(cands, key=lambda g: (max(ready, rep.group_free(g)) + rep.transition(g, ep)[0],
                                            rep.transition(g, ep)[0]))
        out.append(rep.place(job, grp))
    out.sort(key=lambda a: (a.start_s, a.end_s))
    return Plan(policy=policy, assignments=out)


def wspt_order(jobs: Sequence[PlanJob], endpoints: dict[str, EndpointModel]) -> list[PlanJob]:
    """Weighted shortest processing time first on GPU area: ascending p_j·tp_j / w_j,
    ties by submission sequence. Dependencies come before dependants."""
    ranked = sorted(jobs, key=lambda j: (j.service_s * endpoints[j.endpoint].tp / j.weight, j.seq))
    return topo_stable(ranked)


def fifo_order(jobs: Sequence[PlanJob]) -> list[PlanJob]:
    """Strict priority level, then submission order (what priority queues give)."""
    return topo_stable(sorted(jobs, key=lambda j: (j.priority, j.seq)))


def topo_stable(ranked: Sequence[PlanJob]) -> list[PlanJob]:
    """Reorder ``ranked`` minimally so every job follows its in-batch dependencies."""
    ids = {j.id for j in ranked}
    placed: set[str] = set()
    out: list[PlanJob] = []
    pending = list(ranked)
    while pending:
        progressed = False
        rest = []
        for j in pending:
            if all(d in placed or d not in ids for d in j.deps):
                out.append(j)
                placed.add(j.id)
                progressed = True
            else:
                rest.append(j)
        if not progressed:
            raise ValueError(f"dependency cycle among {[j.id for j in rest][:5]}")
        pending = rest
    return out


class Prune:
    """Stops a list-scheduling construction that cannot score below ``bound``.

    Lower bound on the score of every completion of a partial plan (placed jobs P,
    unplaced U): Σ_P w_j (C_j − r_j) + max(S, D), where
        S = Σ_U w_j (max(r_j, now) − r_j + p_j)   (a job starts no earlier than it is ready),
        D = Σ_U w_j (m − r_j + p_j)               (m = the earliest time any GPU is free:
    free times only grow as jobs are placed, so no unplaced job starts before m; D is
    also valid for a job released after m, whose term it only underestimates), and the
    evaluator's future cost and set-point cost (``FleetState.set_point_weight``) are ≥ 0,
    so leaving them out keeps it a lower bound. :meth:`placed` returns False once the bound exceeds
    ``bound`` (with a relative margin of 1e-9, so float summation order never prunes a
    plan that would tie): that construction would lose to the plan that set ``bound``.
    """

    __slots__ = ("limit", "now", "done", "s_rest", "w_rest", "wr_rest", "wp_rest", "free_at", "m", "heap")

    def __init__(self, jobs: Sequence[PlanJob], now_s: float, bound: float, free_at: dict[str, float],
                 heap: list[tuple[float, str]] | None = None):
        self.now, self.free_at = now_s, free_at
        self.limit = bound + 1e-9 * abs(bound) + 1e-9
        self.done = 0.0
        self.s_rest = sum(j.weight * (max(j.release_s, now_s) - j.release_s + j.service_s) for j in jobs)
        self.w_rest = sum(j.weight for j in jobs)
        self.wr_rest = sum(j.weight * j.release_s for j in jobs)
        self.wp_rest = sum(j.weight * j.service_s for j in jobs)
        # m = min(free_at.values()), kept with a heap of (free time, GPU) entries: one
        # pushed per GPU placed on, stale ones (the GPU's free time moved on) popped
        # ``heap``: that heap of this ``free_at`` built already (copied: the caller's stays)
        if heap is None:
            self.heap = [(f, u) for u, f in free_at.items()]
            heapq.heapify(self.heap)
        else:
            self.heap = list(heap)
        self.m = self.heap[0][0]

    def placed(self, job: PlanJob, group: Sequence[str], end_s: float) -> bool:
        """Account for ``job`` placed on ``group``, completing at ``end_s``; False: the plan
        cannot win."""
        w, r, p = job.weight, job.release_s, job.service_s
        self.done += w * (end_s - r)
        self.s_rest -= w * (max(r, self.now) - r + p)
        self.w_rest -= w
        self.wr_rest -= w * r
        self.wp_rest -= w * p
        fa, heap = self.free_at, self.heap
        for u in group:
            heapq.heappush(heap, (fa[u], u))
        while heap[0][0] != fa[heap[0][1]]:
            heapq.heappop(heap)
        self.m = heap[0][0]
        d = self.m * self.w_rest - self.wr_rest + self.wp_rest
        return self.done + (d if d > self.s_rest else self.s_rest) <= self.limit


class TardinessPrune:
    """:class:`Prune` for the weighted-tardiness score (:mod:`makespan.planner.evaluator`: T + ε·(Σ w_j
    (C_j − r_j) + future cost)). Lower bound on every completion of a partial plan (placed
    P, unplaced U): Σ_P c_j(C_j) + Σ_U c_j(max(r_j, now, m) + p_j), where c_j(C) =
    w_j·max(0, C − d_j) + ε·w_j (C − r_j) (no tardiness term without a deadline) and m is
    the earliest time any GPU is free when the U-sum was last computed (free times only
    grow, so no unplaced job completes before that; dependencies and transitions only
    delay it; the future cost and the set-point cost are ≥ 0, left out). The U-sum is recomputed after every
    :attr:`REFRESH` placements when m has grown; a placed job leaves it with the term it
    had. Same margin as :class:`Prune`."""

    REFRESH = 16

    __slots__ = ("limit", "now", "free_at", "done", "rest", "left", "terms", "eps", "since", "m")

    def __init__(self, jobs: Sequence[PlanJob], now_s: float, bound: float, free_at: dict[str, float], eps: float):
        self.now, self.free_at, self.eps = now_s, free_at, eps
        self.limit = bound + 1e-9 * abs(bound) + 1e-9
        self.done = 0.0
        self.left = {j.id: j for j in jobs}  # unplaced jobs
        self.terms: dict[str, float] = {}  # their terms in ``rest``
        self.m = -math.inf
        self.rest, self.since = self._refresh(), 0

    def _cost(self, job: PlanJob, c: float) -> float:
        w, d = job.weight, job.deadline_s
        return (w * (c - d) if d is not None and c > d else 0.0) + self.eps * w * (c - job.release_s)

    def _refresh(self) -> float:
        m = max(self.now, min(self.free_at.values()))
        if m == self.m:  # the terms left are those of this m
            return self.rest
        self.m = m
        cost = self._cost
        self.terms = {i: cost(j, (j.release_s if j.release_s > m else m) + j.service_s) for i, j in self.left.items()}
        return sum(self.terms.values())

    def placed(self, job: PlanJob, group: Sequence[str], end_s: float) -> bool:
        """Account for ``job`` placed, completing at ``end_s``; False: the plan cannot win."""
        self.done += self._cost(job, end_s)
        del self.left[job.id]
        self.rest -= self.terms.pop(job.id)
        self.since += 1
        if self.since >= self.REFRESH:
            self.rest, self.since = self._refresh(), 0
        return self.done + self.rest <= self.limit


def pruner(jobs: Sequence[PlanJob], state: FleetState, bound: float, free_at: dict[str, float],
           objective: str = "weighted_completion", heap: list[tuple[float, str]] | None = None,
           ) -> Prune | TardinessPrune | None:
    """A :class:`Prune` (``objective`` "weighted_tardiness": :class:`TardinessPrune`) for
    ``bound`` over the replay's ``free_at`` (GPU uuid -> s), or None when ``bound`` is
    infinite (nothing to prune). ``heap``: :class:`Prune`'s heap of ``free_at``, heapified
    already (the same list ``heapq.heapify`` makes of its (free time, GPU) pairs)."""
    if math.isinf(bound):
        return None
    if objective == "weighted_tardiness":
        return TardinessPrune(jobs, state.now_s, bound, free_at, TARDINESS_EPS)
    return Prune(jobs, state.now_s, bound, free_at, heap)
