"""Greedy constructions: fixed baselines and the transition-aware portfolio.

Every construction is list scheduling through :class:`planner.replay.Replay` (one job
at a time, in an order, on a group chosen by a rule); :func:`portfolio` evaluates each
member with :func:`planner.evaluator.evaluate` and keeps the best score.

Fixed baselines (issue 3; not to be tuned):
    * ``fifo``: strict priority level, then submission order; the earliest-free aligned
      group (ties: fleet order), paying any load.
    * ``min-evict``: same order; at the time the job can first be dispatched (a group is
      free), a free group that already holds its model, else the free group whose loaded
      models have the smallest total evict cost (their cold-start times).
    * ``wspt``: ascending p_j·tp_j / w_j (Smith 1956 on GPU area); the group that
      completes the job earliest.

Transition-aware members (Σ w(C − r) decides among them):
    * group cost = w_j·C_j + α·(weight of queued batch jobs of every endpoint evicted
      whose last instance this is) × its cold start + β·future cost (recent demand of an
      endpoint whose last instance is evicted × its cold start), so groups that already
      hold the model win unless waiting for them costs more;
    * capacity (``cap-*``, γ = :data:`CAPACITY_GAMMA`): the transition seconds t of a
      candidate group of g GPUs are charged at w_j + γ·g·W_rest/G instead of w_j, where
      W_rest is the weight of the batch's jobs not yet placed and G the fleet's GPUs — a
      transition takes t·g GPU-seconds from the fleet, and under a backlog every job still
      queued waits about t·g/G longer (w_j·C_j alone counts only the job's own delay);
    * whole instances: evicting one GPU of a TP > 1 instance counts as losing the whole
      instance (:meth:`planner.replay.Replay.whole_lost`) in the evict penalty and the
      share term, as in the evaluator's future cost;
    * pull-forward: after a cold start (or wake) of model m, the queued jobs of m released
      by the time that job completes are placed next (they find m warm);
    * share-aware (``ta-share``, ``cap-share``; when ``FleetState.demand_share`` is known): the group
      cost adds the change of the evaluator's share-shortfall term caused by the
      transition (evicting a GPU from an endpoint below its share of recent work costs,
      loading one below its share earns), so the fleet keeps each model on about its
      share of GPUs instead of reloading it for every short queue;
    * partition (:mod:`planner.partition`): residency decided first (GPUs per endpoint
      by its share of the batch's work and recent demand), WSPT inside;
    * orders: WSPT on area, and FIFO. (``setup_order``, WSPT with the cold start
      amortised over the batch's jobs of an endpoint no GPU holds, is no longer a member:
      it won no batch of the policies benchmark once the partition members existed, and
      was removed; ``ta-wspt-nopull`` and ``ta-share-nopull`` gave way to ``cap-aware`` and
      ``cap-share``, the same rules with the capacity term, at the same member count.)

:func:`portfolio` builds the members best-first and stops a construction once a lower
bound on its score exceeds the best so far (:class:`planner.list_schedule.Prune`); it
returns the plan that scoring every member (:func:`members`) would select.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from planner.evaluator import evaluate, evaluate_built, score, share_shortfall_cost
from planner.list_schedule import fifo_order, pruner, wspt_order
from planner.partition import partition_built
from planner.model import Assignment, EndpointModel, FleetState, Plan, PlanJob
from planner.replay import Group, Replay


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


def _rule_free(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
    return min(cands, key=lambda g: max(ready, rep.group_free(g)))


def _rule_min_evict(rep: Replay, job: PlanJob, cands: list[Group], ready: float) -> Group:
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
    """:func:`_rule_min_evict` for single-GPU groups (the same choice, without the sets)."""
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


class _Aware:
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

    def placed(self, job: PlanJob) -> None:
        self.queued[job.endpoint] -= job.weight
        self.wrem -= job.weight

    def _capacity(self, job: PlanJob, gpus: int) -> float:
        """Weight·s per transition second on ``gpus`` GPUs: the GPU-seconds it takes from
        the fleet delay the batch's unplaced jobs by about that ÷ G each."""
        return self.per_gpu * gpus * max(self.wrem - job.weight, 0.0)

    def _penalty(self, e: str, eep_cold_s: float) -> float:
        return (self.alpha * max(self.queued.get(e, 0.0), 0.0) + self.beta * self.demand.get(e, 0.0)) * eep_cold_s

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
        res = rep.resident
        wt = w + self._capacity(job, ep.tp)
        for g in cands:
            s = max(ready, rep.group_free(g))
            if w * s > bc:
                continue
            t = rep.transition_s(g, ep)
            cost = w * s + wt * t
            if t > 0:
                for e in {res[u] for u in g}:
                    if e is None or e == ep.name:
                        continue
                    eep = rep.endpoints.get(e)
                    if eep is None:
                        continue
                    lost = rep.whole_lost(g, e)
                    if lost and rep.whole_gpus(e) - lost < eep.tp:  # its last whole instance goes
                        cost += self._penalty(e, eep.cold_start_s)
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
        fa, res, asl, eps, cnt = rep.free_at, rep.resident, rep.asleep, rep.endpoints, rep.count
        gain = 0.0
        if name in coef:
            k, sh = coef[name]
            c = cnt.get(name, 0)
            gain = k * (max(0.0, sh - c - 1) - max(0.0, sh - c))  # ≤ 0: loading earns
        credit = -beta * gain
        wt = w + self._capacity(job, 1)
        best, bc, bt = cands[0], float("inf"), float("inf")
        evict: dict[str | None, tuple[float, float | None, int]] = {}  # resident -> _evict_share(...)
        for g in cands:
            u = g[0]
            s = fa[u]
            if s < ready:
                s = ready
            if w * s > bc + credit:
                continue
            r = res[u]
            if r == name:
                t = 0.0
                cost = w * s
            else:
                hit = evict.get(r)
                if hit is None:
                    hit = evict[r] = self._evict_share(rep, r)
                ev, term, c = hit
                t = ev + (wake if wake is not None and name in asl[u] else cold)
                cost = w * s + wt * t + beta * gain
                if term is not None:
                    cost += term
                elif c >= 0:  # a GPU of a TP > 1 instance: the whole instance goes
                    k, sh = coef[r]  # type: ignore[index]
                    lost = rep.whole_lost(g, r)  # type: ignore[arg-type]
                    if lost:
                        cost += beta * k * (max(0.0, sh - c + lost) - max(0.0, sh - c))
            if cost < bc or (cost == bc and t < bt):
                best, bc, bt = g, cost, t
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
        fa, res, asl, eps, cnt = rep.free_at, rep.resident, rep.asleep, rep.endpoints, rep.count
        wt = w + self._capacity(job, 1)
        best, bc, bt = cands[0], float("inf"), float("inf")
        evict: dict[str | None, tuple[float, float | None, EndpointModel | None, int]] = {}  # resident -> _evict(...)
        for g in cands:
            u = g[0]
            s = fa[u]
            if s < ready:
                s = ready
            if w * s > bc:
                continue
            r = res[u]
            if r == name:
                t = 0.0
                cost = w * s
            else:
                hit = evict.get(r)
                if hit is None:
                    hit = evict[r] = self._evict(rep, r)
                ev, pen, gang, whole = hit
                t = ev + (wake if wake is not None and name in asl[u] else cold)
                cost = w * s + wt * t
                if pen is not None:
                    cost += pen
                elif gang is not None:
                    lost = rep.whole_lost(g, r)  # type: ignore[arg-type]
                    if lost and whole - lost < gang.tp:
                        cost += self._penalty(r, gang.cold_start_s)  # type: ignore[arg-type]
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
    return _Aware(batch, state, alpha, beta)


def construct(name: str, order: Sequence[PlanJob], state: FleetState, rule: str = "completion",
              pull: bool = False, alpha: float = 1.0, beta: float = 1.0, gamma: float = 0.0,
              bound: float = math.inf) -> list[Assignment] | None:
    """List-schedule ``order`` with the named group ``rule`` ("completion", "free",
    "min-evict", "aware", "share"); ``pull`` enables pull-forward after a load. Returns
    the assignments (complete, in placement order), or None as soon as the plan provably
    scores above ``bound`` (:class:`planner.list_schedule.Prune`; never with the default)."""
    built = _construct(order, state, rule, pull, alpha, beta, gamma, bound)
    return None if built is None else built[0]


def _construct(order: Sequence[PlanJob], state: FleetState, rule: str, pull: bool, alpha: float, beta: float,
               gamma: float, bound: float) -> tuple[list[Assignment], Replay] | None:
    """:func:`construct`, also returning the :class:`Replay` that placed the assignments
    (for :func:`planner.evaluator.evaluate_built`)."""
    rep = Replay(state)
    prune = pruner(order, state, bound, rep.free_at)
    aware = _Aware(order, state, alpha, beta, share=rule == "share", gamma=gamma) if rule in ("aware", "share") else None
    fn = aware or {"completion": rule_completion, "free": _rule_free, "min-evict": _rule_min_evict}[rule]
    ids = {j.id for j in order}
    # pull-forward candidates: per endpoint, its jobs neither placed nor pulled yet, in order
    waiting: dict[str, dict[str, PlanJob]] = {}
    if pull:
        for j in order:
            waiting.setdefault(j.endpoint, {})[j.id] = j
    placed: set[str] = set()
    queue, pulled = deque(order), deque()
    out: list[Assignment] = []
    cands_of: dict[str, list[Group]] = {}
    fa, now = rep.free_at, state.now_s
    while pulled or queue:
        job = pulled.popleft() if pulled else queue.popleft()
        if job.id in placed:
            continue
        cands = cands_of.get(job.endpoint)
        if cands is None:
            ep = rep.endpoints[job.endpoint]
            cands = cands_of[job.endpoint] = rep.groups(ep)
            if not cands:
                raise ValueError(f"job {job.id}: no GPU group fits endpoint {ep.name}")
        ready = rep.ready(job) if job.deps else max(job.release_s, now)
        g = fn(rep, job, cands, ready)
        s = fa[g[0]] if len(g) == 1 else rep.group_free(g)
        a = rep.place(job, g, s if s > ready else ready)  # its default start, max(ready, free)
        if prune is not None and not prune.placed(job, a.gpus, a.end_s):
            return None
        out.append(a)
        placed.add(job.id)
        if aware is not None:
            aware.placed(job)
        if pull:
            rest = waiting[job.endpoint]
            rest.pop(job.id, None)
            if a.load != "warm":
                end = a.end_s
                # queued jobs of the endpoint released by then, in order (a job already
                # pulled and not placed keeps its place)
                for o in [o for o in rest.values() if o.release_s <= end
                          and (not o.deps or all(d in placed or d not in ids for d in o.deps))]:
                    pulled.append(o)
                    del rest[o.id]
    return out, rep


def fifo(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return evaluate(construct("fifo", fifo_order(batch), state, "free"), batch, state, "fifo")


def min_evict(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return evaluate(construct("min-evict", fifo_order(batch), state, "min-evict"), batch, state, "min-evict")


def wspt(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    return evaluate(construct("wspt", wspt_order(batch, state.endpoints), state), batch, state, "wspt")


MEMBERS = ("wspt", "ta-wspt", "ta-fifo", "min-evict", "cap-aware", "ta-share", "cap-share",
           "partition", "partition-spill")
CAPACITY_GAMMA = 2.0  # γ of the cap-* members (module doc); 1 and 4 were no better
# Order in which :func:`portfolio` builds the members (the most frequent winners in the
# policies benchmark first, so that their score prunes the others early); the choice
# does not depend on it.
BUILD_ORDER = ("cap-share", "ta-share", "cap-aware", "wspt", "partition", "partition-spill",
               "ta-wspt", "ta-fifo", "min-evict")

Builder = Callable[..., "tuple[list[Assignment], Replay] | None"]  # called with bound=


def _builders(batch: Sequence[PlanJob], state: FleetState) -> dict[str, Builder]:
    """Member name -> its construction, given a score bound: (assignments, the replay that
    placed them), None when pruned or skipped."""
    w = wspt_order(batch, state.endpoints)
    f = fifo_order(batch)
    cap = CAPACITY_GAMMA
    specs = [("wspt", w, "completion", False, 0.0, 0.0),
             ("ta-wspt", w, "aware", True, 1.0, 0.0),
             ("ta-fifo", f, "aware", True, 1.0, 0.0),
             ("min-evict", f, "min-evict", False, 0.0, 0.0),
             ("cap-aware", w, "aware", False, 1.0, cap)]
    if state.demand_share:
        specs += [("ta-share", w, "share", True, 1.0, 0.0), ("cap-share", w, "share", False, 1.0, cap)]
    out: dict[str, Builder] = {
        n: partial(_construct, o, state, r, p, a, 1.0, g) for n, o, r, p, a, g in specs}
    for name, spill in (("partition", False), ("partition-spill", True)):
        out[name] = partial(_partition, batch, state, spill)
    return out


def _partition(batch: Sequence[PlanJob], state: FleetState, spill: bool,
               bound: float) -> tuple[list[Assignment], Replay] | None:
    return partition_built(batch, state, spill, bound=bound)


def members(batch: Sequence[PlanJob], state: FleetState) -> list[Plan]:
    """Every portfolio member, evaluated, in :data:`MEMBERS` order (the baselines are
    members too; ``partition`` members are absent when the fleet cannot hold them)."""
    out = []
    for name, build in _builders(batch, state).items():
        built = build(bound=math.inf)
        if built is not None:
            out.append(evaluate(built[0], batch, state, name, check_times=False))
    return sorted(out, key=lambda p: MEMBERS.index(p.policy))


def portfolio(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    """Best-scored member (ties: first in :data:`MEMBERS`); ``stats['member']`` is the
    winner's index in :data:`MEMBERS`. The same plan as the best of :func:`members`, built
    in :data:`BUILD_ORDER` with each construction stopped once it provably scores above
    the best so far (:class:`planner.list_schedule.Prune`)."""
    builders = _builders(batch, state)
    best: Plan | None = None
    rank = (math.inf, len(MEMBERS))
    first = {n: i for i, n in enumerate(BUILD_ORDER)}
    for name in sorted(builders, key=lambda n: first.get(n, len(first))):  # a member not listed: last
        built = builders[name](bound=rank[0])
        if built is None:
            continue
        p = evaluate_built(built[0], built[1], batch, state, name)  # = evaluate(..., check_times=False)
        r = (score(p), MEMBERS.index(name))
        if r < rank:
            best, rank = p, r
    assert best is not None, "a construction without a bound always completes"
    best.stats["member"] = float(rank[1])
    best.policy = "portfolio"
    return best
