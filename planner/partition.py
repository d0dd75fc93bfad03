"""Partition member of the greedy portfolio: give each endpoint a set of GPU groups for
the whole batch, then list-schedule inside them.

Why: list scheduling that picks, job by job, the group completing the job earliest
(``wspt`` and the transition-aware rules) loads a model on whatever GPU frees first
whenever a cold start is shorter than the wait for a warm instance; over a batch that
interleaves models this pays one cold start for every second job. Deciding the
residency first (which model occupies which GPUs for the batch) and sequencing second is
the classic decomposition for scheduling with family setups (Monma & Potts 1989; Allahverdi
et al., EJOR 187 (2008) 985–1032, survey of setup scheduling).

Allocation (deterministic):
    1. work per endpoint W_e = Σ p_j·tp_j of its batch jobs, plus, when the fleet state
       carries ``demand_share``, share_e × the batch's total work (recent demand keeps a
       model with no queued job on its share of GPUs);
    2. GPUs per endpoint by largest remainder of G·W_e/ΣW, in multiples of tp_e, at
       least one instance for every endpoint with batch jobs (the member is skipped when
       the fleet cannot hold one instance of each: :func:`allocate` returns None);
    3. concrete groups: first the groups where the endpoint is already resident (no cold
       start), then, larger TP first, the aligned groups whose GPUs are all unclaimed,
       earliest free first.
Sequencing: WSPT order (ascending p_j·tp_j / w_j); each job on the group of its endpoint
that completes it earliest. The plan is scored by the evaluator like every member.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from makespan.planner import placement_index
from makespan.planner.list_schedule import pruner, wspt_order
from makespan.planner.model import Assignment, EndpointModel, FleetState, PlanJob
from makespan.planner.placement_index import GroupIndex, IndexTemplates
from makespan.planner.replay import Group, Replay


def allocate(batch: Sequence[PlanJob], state: FleetState) -> dict[str, list[Group]] | None:
    """Endpoint -> its GPU groups for the batch (module doc), or None when impossible."""
    eps = state.endpoints
    work: dict[str, float] = {}
    for j in batch:
        work[j.endpoint] = work.get(j.endpoint, 0.0) + j.service_s * eps[j.endpoint].tp
    needed = set(work)
    total = sum(work.values())
    for e, sh in state.demand_share.items():
        if e in eps and sh > 0:
            work[e] = work.get(e, 0.0) + sh * total
    total = sum(work.values())
    n_gpus = len(state.gpus)
    if total <= 0 or not math.isfinite(total) or sum(eps[e].tp for e in needed) > n_gpus:
        return None  # (a sum that overflowed: no shares to split by)
    # instances by largest remainder, at least one for endpoints with jobs
    quota = {e: n_gpus * w / total / eps[e].tp for e, w in work.items()}
    inst = {e: max(int(math.floor(q)), 1 if e in needed else 0) for e, q in quota.items()}
    used = sum(inst[e] * eps[e].tp for e in inst)
    while used > n_gpus:  # minimums overshot: take from the most over-served
        e = max((e for e in inst if inst[e] > (1 if e in needed else 0)), key=lambda e: inst[e] - quota[e])
        inst[e] -= 1
        used -= eps[e].tp
    for e in sorted(quota, key=lambda e: (-(quota[e] - math.floor(quota[e])), e)):
        if used + eps[e].tp <= n_gpus and inst[e] < math.ceil(quota[e]):
            inst[e] += 1
            used += eps[e].tp
    rep = Replay(state)
    claimed: set[str] = set()
    out: dict[str, list[Group]] = {e: [] for e in inst}
    res = rep.resident
    holding = set(res.values())
    for e in inst:  # groups already holding e (none where no GPU holds e: the scan is skipped)
        if e not in holding:
            continue
        for g in rep.groups(eps[e]):
            if len(out[e]) >= inst[e]:
                break
            if res[g[0]] == e and all(res[u] == e for u in g) and not any(u in claimed for u in g):
                out[e].append(g)
                claimed.update(g)
    by_free: dict[tuple[int, int], list[Group]] = {}  # a key's groups, earliest free first (ties: fleet order)
    # key -> where its next scan starts: every group before it is claimed (claims are never
    # undone), so the scan below finds the same unclaimed groups from there
    start: dict[tuple[int, int], int] = {}
    fa = rep.free_at
    for e in sorted(inst, key=lambda e: (-eps[e].tp, -work[e], e)):
        if len(out[e]) >= inst[e]:
            continue
        key = (eps[e].tp, eps[e].memory_mib)
        if key not in by_free:
            by_free[key] = sorted(rep.groups(eps[e]), key=(lambda g: fa[g[0]]) if key[0] == 1 else rep.group_free)
            start[key] = 0
        ordered, mine, want = by_free[key], out[e], inst[e]
        k = start[key]
        while k < len(ordered) and len(mine) < want:  # the unclaimed ones, in that order
            g = ordered[k]
            if (g[0] not in claimed) if len(g) == 1 else not any(u in claimed for u in g):
                mine.append(g)
                claimed.update(g)
            k += 1
        start[key] = k
        if e in needed and not out[e]:
            return None  # fragmentation: no aligned group left for a needed endpoint
    return out


def _indexes(rep: Replay, alloc: dict[str, list[Group]],
             spill_groups: dict[int, list[tuple[str, Group, float, int]]],
             templates: IndexTemplates | None) -> tuple[dict[str, GroupIndex], dict[int, GroupIndex]]:
    """The candidate indexes of :func:`partition_built` on the fresh ``rep``: endpoint ->
    the index of its allocated groups, TP -> the index of the spill groups (tagged with
    their endpoint and smallest GPU memory), for the lists :func:`placement_index.enabled`
    indexes; cloned from ``templates`` when given."""
    def index(key: tuple, groups: list[Group], tags: list[tuple[str, int]] | None = None) -> GroupIndex:
        return GroupIndex(rep, groups, tags) if templates is None else templates.index(key, rep, groups, tags)

    own = {e: index(("own", e), gs) for e, gs in alloc.items() if placement_index.enabled(len(gs))}
    spill = {tp: index(("spill", tp), [g for _, g, _, _ in sg], [(e, m) for e, _, _, m in sg])
             for tp, sg in spill_groups.items() if placement_index.enabled(len(sg))}
    return own, spill


def partition(batch: Sequence[PlanJob], state: FleetState, spill: bool = False,
              bound: float = math.inf, order: Sequence[PlanJob] | None = None) -> list[Assignment] | None:
    """The member's assignments (complete, in placement order), or None when skipped or
    when the plan provably scores above ``bound`` (:class:`makespan.planner.list_schedule.Prune`).
    ``order``: the sequence to place the jobs in (default: WSPT; dependencies first).

    ``spill``: a job may also take a group allocated to another endpoint (of its TP, whose
    GPUs have the memory it needs) when it would
    complete there earlier than on its own groups by more than that endpoint's cold start
    (the reload the other endpoint pays later) — work-conserving when the allocation is
    uneven."""
    built = partition_built(batch, state, spill, bound, order)
    return None if built is None else built[0]


def partition_built(batch: Sequence[PlanJob], state: FleetState, spill: bool = False, bound: float = math.inf,
                    order: Sequence[PlanJob] | None = None,
                    objective: str = "weighted_completion",
                    alloc: dict[str, list[Group]] | None = None,
                    templates: IndexTemplates | None = None,
                    report: dict[str, bool] | None = None) -> tuple[list[Assignment], Replay] | None:
    """:func:`partition`, also returning the :class:`Replay` that placed the assignments
    (for :func:`makespan.planner.evaluator.evaluate_built`); ``bound`` is on the score of
    ``objective`` (:func:`makespan.planner.list_schedule.pruner`). ``alloc``: the batch's
    :func:`allocate` when the caller has it already (None: computed here); ``templates``:
    candidate indexes of ``state`` to clone instead of building (the same plan either way;
    keyed by endpoint and TP, so only for calls with the same ``alloc``). ``report`` (with
    ``spill``): ``report["spilled"]`` says whether some job took a group allocated to
    another endpoint so far (also when the construction stops early). While it is False the
    construction has placed every job as the one without ``spill`` (same ``alloc``, same
    ``bound``) does: a completed construction that never spilled is that plan, and one that
    stopped early before spilling means that one stops there too."""
    if alloc is None:
        alloc = allocate(batch, state)
    if alloc is None:
        return None
    rep = Replay(state) if templates is None else templates.replay()
    prune = pruner(batch, state, bound, rep.free_at, objective, None if templates is None else templates.heap())
    fa, res, asl, eps = rep.free_at, rep.resident, rep.asleep, rep.endpoints
    out: list[Assignment] = []
    # TP -> (endpoint, group, its cold start, the group's smallest GPU memory in MiB)
    spill_groups: dict[int, list[tuple[str, Group, float, int]]] = {}
    if spill:
        mem = rep._mem
        for e, gs in alloc.items():
            for g in gs:
                spill_groups.setdefault(len(g), []).append((e, g, eps[e].cold_start_s, min(mem[u] for u in g)))
    # candidate indexes (placement_index: a bounded scan on a large fleet), kept current below
    own_index, spill_index = _indexes(rep, alloc, spill_groups, templates)
    indexes = [*own_index.values(), *spill_index.values()]
    report = report if report is not None else {}
    report["spilled"] = False

    def transition_s(g: Group, ep: EndpointModel) -> float:
        """:meth:`Replay.transition_s`, inlined for a single GPU."""
        if len(g) != 1:
            return rep.transition_s(g, ep)
        r = res[g[0]]
        if r == ep.name:
            return 0.0
        ev = eps[r].evict_s if r is not None and r in eps else 0.0
        return ev + ep.wake_s if ep.wake_s is not None and ep.name in asl[g[0]] else ev + ep.cold_start_s

    for job in (order if order is not None else wspt_order(batch, eps)):
        ep = eps[job.endpoint]
        ready = rep.ready(job)
        best, bc = None, math.inf
        # a job with helpers or hosts scans whole lists: the index's candidates are the best of
        # each signature, and those may be groups its helpers do not fit on, or other hosts'
        own = own_index.get(job.endpoint) if not job.narrowed else None
        fit = set(rep.job_groups(job)) if job.narrowed else None  # groups where its helpers fit too, on its hosts
        for g in alloc[job.endpoint] if own is None else own.candidates(ready):
            if fit is not None and g not in fit:
                continue
            s0 = fa[g[0]] if len(g) == 1 else rep.group_free(g)
            c = (s0 if s0 > ready else ready) + transition_s(g, ep)
            if c < bc:
                best, bc = g, c
        if best is None:
            return None
        if spill:
            own_best = best
            sg = spill_groups.get(ep.tp, [])
            si = spill_index.get(ep.tp) if not job.narrowed else None
            for e2, g, pen, gpu_mib in sg if si is None else [sg[i] for i in si.positions(ready)]:
                if e2 == job.endpoint or gpu_mib < ep.memory_mib or (fit is not None and g not in fit):
                    continue  # its own, or too small for it (or its helpers)
                s0 = fa[g[0]] if len(g) == 1 else rep.group_free(g)
                if s0 < ready:
                    s0 = ready
                if s0 + pen >= bc:  # cannot win even warm
                    continue
                c = s0 + transition_s(g, ep) + pen
                if c < bc:
                    best, bc = g, c
            if best is not own_best:
                report["spilled"] = True
        a = rep.place(job, best)
        for index in indexes:
            index.touch(best)
        if prune is not None and not prune.placed(job, a.gpus, a.end_s):
            return None
        out.append(a)
    return out, rep
