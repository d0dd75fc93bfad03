"""Group rules of the greedy constructions (:mod:`makespan.planner.greedy`): given the replay, a
job, its candidate groups (aligned groups of its TP size, in fleet order) and the time it
is ready, each returns the group to place it on.

    * :func:`rule_completion` (``wspt``): the group completing the job earliest;
    * :func:`rule_free` (``fifo``) and :func:`rule_min_evict` (``min-evict``): the fixed
      baselines;
    * :class:`Aware` (``ta-*``, ``cap-*``, and :func:`aware_rule` for other dynamic
      constructions): the transition-aware group cost described in :mod:`makespan.planner.greedy`
      (evict penalty, capacity term, whole instances, share-aware variant; with
      ``FleetState.set_point_weight`` > 0, the set-point absence a placement adds,
      :meth:`Aware._set_point`).

The single-GPU cases are inlined (``_single``, ``_by_share_single``,
``_min_evict_single``): the hot loops of the portfolio. They make the same choice as the
general code: same costs, same float operations, same tie-breaks.
"""

from __future__ import annotations

from collections.abc import Sequence

from makespan.planner.evaluator import share_shortfall_cost
from makespan.planner.model import EndpointModel, FleetState, PlanJob
from makespan.planner.replay import Group, Replay
from makespan.planner.restore import set_point_groups


def rule_completion(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
    """The candidate group completing ``job`` earliest (ties: shorter transition, then
    candidate order), starting no earlier than ``ready`` (s)."""
    ep = rep.endpoints[job.endpoint]
    best, bc, bt = cands[0], float("inf"), float("inf")
    fa, res, asl, eps = rep.free_at, rep.resident, rep.asleep, rep.endpoints
    name, cold, wake = ep.name, ep.cold_start_s, ep.wake_s
    for g in cands:
        if len(g) == 1:  # Replay.transition_s inlined (a hot loop)
            u = g[0]
            s = fa[u]
            if s < ready:
                s = ready
            if s > bc:
                continue
            r = res[u]
            if r == name:
                t = 0.0
            else:
                ev = eps[r].evict_s if r is not None and r in eps else 0.0
                t = ev + wake if wake is not None and name in asl[u] else ev + cold
        else:
            s = rep.group_free(g)
            if s < ready:
                s = ready
            if s > bc:
                continue
            t = rep.transition_s(g, ep)
        c = s + t
        if c < bc or (c == bc and t < bt):
            best, bc, bt = g, c, t
    return best


def rule_free(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
    """The earliest-free candidate group (ties: candidate order)."""
    return min(cands, key=lambda g: max(ready, rep.group_free(g)))


def rule_min_evict(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
    """At the time the job can first start (a group is free): the first free group that
    holds its model, else the free group whose loaded models have the smallest total
    cold-start time."""
    if len(cands[0]) == 1:
        return _min_evict_single(rep, job, cands, ready)
    free_s = [rep.group_free(g) for g in cands]
    t0 = max(ready, min(free_s))
    free = [g for g, f in zip(cands, free_s) if f <= t0]
    ep = rep.endpoints[job.endpoint]
    for g in free:
        if all(rep.resident[u] == ep.name for u in g):
            return g

    def evict_cost(g: Group) -> float:
        return sum(rep.endpoints[e].cold_start_s for e in {rep.resident[u] for u in g} - {None} if e in rep.endpoints)
    return min(free, key=evict_cost)


def _min_evict_single(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
    """:func:`rule_min_evict` for single-GPU groups (the same choice, without the sets)."""
    fa, res, eps = rep.free_at, rep.resident, rep.endpoints
    free_s = [fa[g[0]] for g in cands]
    t0 = max(ready, min(free_s))
    name = job.endpoint
    best, bc = None, 0.0
    for g, f in zip(cands, free_s):
        if f > t0:
            continue
        r = res[g[0]]
        if r == name:
            return g
        c = eps[r].cold_start_s if r is not None and r in eps else 0.0
        if best is None or c < bc:
            best, bc = g, c
    return best  # type: ignore[return-value]


class Aware:
    """Transition-aware group rule; tracks the queued weight per endpoint."""

    def __init__(self, batch: Sequence[PlanJob], state: FleetState, alpha: float, beta: float,
                 share: bool = False, gamma: float = 0.0):
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        self.wrem = sum(j.weight for j in batch)
        self.per_gpu = gamma / max(1, len(state.gpus))
        self.state = state
        self.share = share and bool(state.demand_share)
        self._coef_cache = self._coef() if self.share else {}
        self.queued: dict[str, float] = {}
        for j in batch:
            self.queued[j.endpoint] = self.queued.get(j.endpoint, 0.0) + j.weight
        self.demand = state.demand
        # set-point term (FleetState.set_point_weight > 0): GPU -> its set-point instance
        self.spw = state.set_point_weight
        self.sp_of: dict[str, tuple[str, Group]] = {u: (e, g) for e, g in set_point_groups(state) for u in g} \
            if self.spw > 0 else {}
        self._sp_hits: dict[Group, list[tuple[str, Group]]] = {}

    def placed(self, job: PlanJob) -> None:
        self.queued[job.endpoint] -= job.weight
        self.wrem -= job.weight

    def _capacity(self, job: PlanJob, gpus: int) -> float:
        """Weight·s per transition second on ``gpus`` GPUs: the GPU-seconds it takes from
        the fleet delay the batch's unplaced jobs by about that ÷ G each."""
        return self.per_gpu * gpus * max(self.wrem - job.weight, 0.0)

    def _penalty(self, e: str, eep_cold_s: float) -> float:
        return (self.alpha * max(self.queued.get(e, 0.0), 0.0) + self.beta * self.demand.get(e, 0.0)) * eep_cold_s

    def _set_point(self, rep: Replay, g: Group, name: str, s: float, t: float, p: float) -> float:
        """Set-point cost (weight·s) of placing a job of ``name`` on ``g`` from ``s`` (its
        transition ``t``, service ``p``, s), for every set-point instance I sharing a GPU
        with ``g`` (none, or another endpoint's group: 0): w_sp × GPUs of I × the absence it
        adds — I resident: t + p + its restore after the job (evict of ``name``, then wake
        or cold start of I's endpoint); I already absent: its restore waits for this job,
        s + t + p − when I's GPUs free now (≥ 0). A job of I's own endpoint on I itself
        displaces nothing. An estimate (later jobs on the group lengthen the absence, the
        evaluator's score counts that); 0 when ``g`` holds no set-point GPU."""
        hits = self._sp_hits.get(g)
        if hits is None:
            hits = self._sp_hits[g] = list(dict.fromkeys(self.sp_of[u] for u in g if u in self.sp_of))
        if not hits:
            return 0.0
        cost = 0.0
        res = rep.resident
        for e, grp in hits:
            if e == name and grp == g:
                continue
            if all(res[u] == e for u in grp):
                eep, jep = rep.endpoints[e], rep.endpoints[name]
                cost += len(grp) * (t + p + jep.evict_s + (eep.wake_s if eep.wake_s is not None else eep.cold_start_s))
            else:
                late = s + t + p - rep.group_free(grp)
                if late > 0:
                    cost += len(grp) * late
        return self.spw * cost

    def _share_delta(self, rep: Replay, g: Group, name: str) -> float:
        """Change of the share-shortfall term if ``name`` is loaded on ``g``."""
        st, res = self.state, rep.resident
        d = 0.0
        for e in {res[u] for u in g} - {None, name}:
            k = rep.whole_lost(g, e)  # type: ignore[arg-type]
            if k:
                c = rep.whole_gpus(e)  # type: ignore[arg-type]
                d += share_shortfall_cost(st, e, c - k) - share_shortfall_cost(st, e, c)  # type: ignore[arg-type]
        c = rep.whole_gpus(name)
        return d + share_shortfall_cost(st, name, c + len(g)) - share_shortfall_cost(st, name, c)

    def __call__(self, rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
        ep = rep.endpoints[job.endpoint]
        if self.share:
            return self._by_share(rep, job, ep, cands, ready)
        if len(cands[0]) == 1:
            return self._single(rep, job, ep, cands, ready)
        w = job.weight
        best, bc, bt = cands[0], float("inf"), float("inf")
        fa, res, asl, eps = rep.free_at, rep.resident, rep.asleep, rep.endpoints
        name, cold, wake = ep.name, ep.cold_start_s, ep.wake_s
        wt = w + self._capacity(job, ep.tp)
        sp_of = self.sp_of
        for g in cands:  # Replay.group_free and Replay.transition_s inlined (gangs: a hot loop)
            f = max(map(fa.__getitem__, g))
            s = f if f > ready else ready
            ws = w * s
            if ws > bc:
                continue
            held = {res[u] for u in g}
            if len(held) == 1 and name in held:
                t = 0.0
            else:
                ev = max((eps[e].evict_s for e in held if e is not None and e in eps), default=0.0)
                t = ev + wake if wake is not None and all(name in asl[u] for u in g) else ev + cold
            cost = ws + wt * t
            if t > 0:
                for e in held:
                    if e is None or e == ep.name:
                        continue
                    eep = rep.endpoints.get(e)
                    if eep is None:
                        continue
                    lost = rep.whole_lost(g, e)
                    if lost and rep.whole_gpus(e) - lost < eep.tp:  # its last whole instance goes
                        cost += self._penalty(e, eep.cold_start_s)
            if sp_of:
                cost += self._set_point(rep, g, name, s, t, job.service_s)
            if cost < bc or (cost == bc and t < bt):
                best, bc, bt = g, cost, t
        return best

    def _by_share(self, rep: Replay, job: PlanJob, ep: EndpointModel, cands: list[Group], ready: float) -> Group:
        if len(cands[0]) == 1:
            return self._by_share_single(rep, job, ep, cands, ready)
        w = job.weight
        best, bc, bt = cands[0], float("inf"), float("inf")
        wt = w + self._capacity(job, ep.tp)
        for g in cands:
            s = max(ready, rep.group_free(g))
            t = rep.transition_s(g, ep)
            cost = w * s + wt * t
            if t > 0:
                cost += self.beta * self._share_delta(rep, g, ep.name)
            if self.sp_of:
                cost += self._set_point(rep, g, ep.name, s, t, job.service_s)
            if cost < bc or (cost == bc and t < bt):
                best, bc, bt = g, cost, t
        return best

    def _coef(self) -> dict[str, tuple[float, float]]:
        """endpoint -> (d_e·cold_e/tp_e, share_e·G): the shortfall term is coef·max(0, S − n)."""
        st = self.state
        g = len(st.gpus)
        return {e: (st.demand.get(e, 1.0) * st.endpoints[e].cold_start_s / st.endpoints[e].tp, sh * g)
                for e, sh in st.demand_share.items() if e in st.endpoints and sh > 0}

    def _by_share_single(self, rep: Replay, job: PlanJob, ep: EndpointModel, cands: list[Group],
                         ready: float) -> Group:
        """:meth:`_by_share` inlined for single-GPU groups (same costs as ``_share_delta``)."""
        coef = self._coef_cache
        w, name, cold, wake, beta = job.weight, ep.name, ep.cold_start_s, ep.wake_s, self.beta
        fa, res, asl, cnt = rep.free_at, rep.resident, rep.asleep, rep.count
        gain = 0.0
        if name in coef:
            k, sh = coef[name]
            c = cnt.get(name, 0)
            gain = k * (max(0.0, sh - c - 1) - max(0.0, sh - c))  # ≤ 0: loading earns
        credit = -beta * gain
        load = beta * gain
        wt = w + self._capacity(job, 1)
        sp_of, p = self.sp_of, job.service_s
        best, bc, bt = cands[0], float("inf"), float("inf")
        lim = bc + credit  # a group waiting past this cannot win
        evict: dict[str | None, tuple[float, float | None, int]] = {}  # resident -> _evict_share(...)
        for g in cands:
            u = g[0]
            s = fa[u]
            if s < ready:
                s = ready
            ws = w * s
            if ws > lim:
                continue
            r = res[u]
            if r == name:
                t = 0.0
                cost = ws
            else:
                hit = evict.get(r)
                if hit is None:
                    hit = evict[r] = self._evict_share(rep, r)
                ev, term, c = hit
                t = ev + (wake if wake is not None and name in asl[u] else cold)
                cost = ws + wt * t + load
                if term is not None:
                    cost += term
                elif c >= 0:  # a GPU of a TP > 1 instance: the whole instance goes
                    k, sh = coef[r]  # type: ignore[index]
                    lost = rep.whole_lost(g, r)  # type: ignore[arg-type]
                    if lost:
                        cost += beta * k * (max(0.0, sh - c + lost) - max(0.0, sh - c))
            if sp_of and u in sp_of:  # ≥ 0: the early skip above stays valid
                cost += self._set_point(rep, g, name, s, t, p)
            if cost < bc or (cost == bc and t < bt):
                best, bc, bt = g, cost, t
                lim = bc + credit
        return best

    def _evict_share(self, rep: Replay, r: str | None) -> tuple[float, float | None, int]:
        """(evict_s, share term of evicting one GPU, GPUs in whole instances) of the resident
        ``r`` in :meth:`_by_share_single`: the term for a TP-1 endpoint with a share (None:
        nothing to add); for a TP > 1 one with a share the term depends on the group, and
        the last item is its :meth:`Replay.whole_gpus` (else -1)."""
        eep = self.state.endpoints.get(r) if r is not None else None  # type: ignore[arg-type]
        ev = eep.evict_s if eep is not None else 0.0
        if r not in self._coef_cache:
            return ev, None, -1
        if eep.tp != 1:  # type: ignore[union-attr]
            return ev, None, rep.whole_gpus(r)  # type: ignore[arg-type]
        k, sh = self._coef_cache[r]  # type: ignore[index]
        c = rep.count.get(r, 0)  # type: ignore[arg-type]
        return ev, self.beta * k * (max(0.0, sh - c + 1) - max(0.0, sh - c)), -1

    def _single(self, rep: Replay, job: PlanJob, ep: EndpointModel, cands: list[Group], ready: float) -> Group:
        """Same rule, inlined for single-GPU groups (the common case; a hot loop)."""
        w, name, cold, wake = job.weight, ep.name, ep.cold_start_s, ep.wake_s
        fa, res, asl = rep.free_at, rep.resident, rep.asleep
        wt = w + self._capacity(job, 1)
        sp_of, p = self.sp_of, job.service_s
        best, bc, bt = cands[0], float("inf"), float("inf")
        evict: dict[str | None, tuple[float, float | None, EndpointModel | None, int]] = {}  # resident -> _evict(...)
        for g in cands:
            u = g[0]
            s = fa[u]
            if s < ready:
                s = ready
            ws = w * s
            if ws > bc:
                continue
            r = res[u]
            if r == name:
                t = 0.0
                cost = ws
            else:
                hit = evict.get(r)
                if hit is None:
                    hit = evict[r] = self._evict(rep, r)
                ev, pen, gang, whole = hit
                t = ev + (wake if wake is not None and name in asl[u] else cold)
                cost = ws + wt * t
                if pen is not None:
                    cost += pen
                elif gang is not None:
                    lost = rep.whole_lost(g, r)  # type: ignore[arg-type]
                    if lost and whole - lost < gang.tp:
                        cost += self._penalty(r, gang.cold_start_s)  # type: ignore[arg-type]
            if sp_of and u in sp_of:  # ≥ 0: the early skip above stays valid
                cost += self._set_point(rep, g, name, s, t, p)
            if cost < bc or (cost == bc and t < bt):
                best, bc, bt = g, cost, t
        return best

    def _evict(self, rep: Replay, r: str | None) -> tuple[float, float | None, EndpointModel | None, int]:
        """(evict_s, penalty of evicting one GPU, the model when that depends on the group,
        its :meth:`Replay.whole_gpus`) of the resident ``r`` in :meth:`_single`: the penalty
        when ``r`` is a TP-1 endpoint on its last GPU (None: nothing to add); a TP > 1
        endpoint: checked per group."""
        eep = rep.endpoints.get(r) if r is not None else None  # type: ignore[arg-type]
        if eep is None:
            return 0.0, None, None, 0
        if eep.tp != 1:
            return eep.evict_s, None, eep, rep.whole_gpus(r)  # type: ignore[arg-type]
        last = rep.count.get(r, 0) - 1 < 1  # type: ignore[arg-type]
        return eep.evict_s, self._penalty(r, eep.cold_start_s) if last else None, None, 0  # type: ignore[arg-type]


def aware_rule(batch: Sequence[PlanJob], state: FleetState, alpha: float = 1.0, beta: float = 1.0):
    """The transition-aware group rule (module doc) for dynamic constructions: call it as
    ``rule(rep, job, candidate_groups, ready_s) -> group`` and ``rule.placed(job)`` after
    each placement (it tracks the queued weight per endpoint)."""
    return Aware(batch, state, alpha, beta)
