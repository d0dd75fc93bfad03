"""Greedy constructions: fixed baselines and the transition-aware portfolio.

Every construction is list scheduling through :class:`makespan.planner.replay.Replay` (one job
at a time, in an order, on a group chosen by a rule, :mod:`makespan.planner.rules`);
:func:`portfolio` scores each member as :func:`makespan.planner.evaluator.evaluate` does (with
:func:`makespan.planner.evaluator.evaluate_built`, from the construction's own replay) and keeps
the best score.

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
      instance (:meth:`makespan.planner.replay.Replay.whole_lost`) in the evict penalty and the
      share term, as in the evaluator's future cost;
    * set point (``FleetState.set_point_weight`` w_sp > 0; the ``ta-*``/``cap-*`` members):
      a group sharing GPUs with a set-point instance costs w_sp × its GPUs × the absence
      the placement adds (resident: transition + service + its restore; already absent:
      how much later its restore can start), :meth:`makespan.planner.rules.Aware._set_point`; the
      evaluator's score, which the portfolio picks by, holds the exact term;
    * pull-forward: after a cold start (or wake) of model m, the queued jobs of m released
      by the time that job completes are placed next (they find m warm);
    * share-aware (``ta-share``, ``cap-share``; when ``FleetState.demand_share`` is known): the group
      cost adds the change of the evaluator's share-shortfall term caused by the
      transition (evicting a GPU from an endpoint below its share of recent work costs,
      loading one below its share earns), so the fleet keeps each model on about its
      share of GPUs instead of reloading it for every short queue;
    * partition (:mod:`makespan.planner.partition`): residency decided first (GPUs per endpoint
      by its share of the batch's work and recent demand), WSPT inside;
    * orders: WSPT on area, and FIFO. (``setup_order``, WSPT with the cold start
      amortised over the batch's jobs of an endpoint no GPU holds, is no longer a member:
      it won no batch of the policies benchmark once the partition members existed, and
      was removed; ``ta-wspt-nopull`` and ``ta-share-nopull`` gave way to ``cap-aware`` and
      ``cap-share``, the same rules with the capacity term, at the same member count.)

:func:`portfolio` builds the members best-first and stops a construction once a lower
bound on its score exceeds the best so far (:class:`makespan.planner.list_schedule.Prune`); it
returns the plan that scoring every member (:func:`members`) would select.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from makespan.planner import placement_index
from makespan.planner.evaluator import InfeasiblePlan, evaluate, evaluate_built, evaluate_retimed, score
from makespan.planner.list_schedule import fifo_order, pruner, wspt_order
from makespan.planner.partition import allocate, partition_built
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob
from makespan.planner.placement_index import GroupIndex, IndexTemplates
from makespan.planner.replay import Group, Replay
from makespan.planner.rules import Aware, rule_completion, rule_free, rule_min_evict
from makespan.planner.sleepers import with_rule


def construct(name: str, order: Sequence[PlanJob], state: FleetState, rule: str = "completion",
              pull: bool = False, alpha: float = 1.0, beta: float = 1.0, gamma: float = 0.0,
              bound: float = math.inf) -> list[Assignment] | None:
    """List-schedule ``order`` with the named group ``rule`` ("completion", "free",
    "min-evict", "aware", "share"); ``pull`` enables pull-forward after a load. Returns
    the assignments (complete, in placement order), or None as soon as the plan provably
    scores above ``bound`` (:class:`makespan.planner.list_schedule.Prune`; never with the default)."""
    built = construct_built(order, state, rule, pull, alpha, beta, gamma, bound)
    return None if built is None else built[0]


def construct_built(order: Sequence[PlanJob], state: FleetState, rule: str = "completion", pull: bool = False,
                    alpha: float = 1.0, beta: float = 1.0, gamma: float = 0.0, bound: float = math.inf,
                    objective: str = "weighted_completion",
                    templates: IndexTemplates | None = None) -> tuple[list[Assignment], Replay] | None:
    """:func:`construct`, also returning the :class:`Replay` that placed the assignments
    (for :func:`makespan.planner.evaluator.evaluate_built`); ``bound`` is on the score of
    ``objective`` (:func:`makespan.planner.list_schedule.pruner`). ``templates``: candidate
    indexes of ``state`` to clone instead of building (shared by the portfolio's members;
    the same plan either way)."""
    rep = Replay(state) if templates is None else templates.replay()
    prune = pruner(order, state, bound, rep.free_at, objective, None if templates is None else templates.heap())
    aware = Aware(order, state, alpha, beta, share=rule == "share", gamma=gamma) if rule in ("aware", "share") else None
    fn = aware or {"completion": rule_completion, "free": rule_free, "min-evict": rule_min_evict}[rule]
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
    # candidate index per job kind (placement_index: a bounded scan on a large fleet), and
    # per candidate list (_index_for): kinds with the same list share one
    index_of: dict[str, GroupIndex | None] = {}
    index_by_list: dict[tuple, GroupIndex] = {}
    indexes: list[GroupIndex] = []
    touched: list[str] = []  # GPUs placed on so far (an index cloned later catches up on them)
    fa, now = rep.free_at, state.now_s
    while pulled or queue:
        job = pulled.popleft() if pulled else queue.popleft()
        if job.id in placed:
            continue
        kind = job.endpoint if not job.narrowed else f"{job.endpoint}+{'+'.join(job.helpers)}@{','.join(job.hosts)}"
        cands = cands_of.get(kind)
        if cands is None:
            ep = rep.endpoints[job.endpoint]
            cands = cands_of[kind] = rep.job_groups(job)
            if not cands:
                raise ValueError(f"job {job.id}: no GPU group fits endpoint {ep.name}"
                                 + (f" with its helpers {', '.join(job.helpers)}" if job.helpers else "")
                                 + (f" on hosts {', '.join(job.hosts)}" if job.hosts else ""))
            # a job's helpers or hosts filter its endpoint's groups: that list is the kind's own
            key = ("kind", kind) if job.narrowed else ("groups", ep.tp, ep.memory_mib)
            index_of[kind] = _index_for(rep, cands, key, index_by_list, indexes, templates, touched)
        ready = rep.ready(job) if job.deps else max(job.release_s, now)
        index = index_of[kind]
        g = fn(rep, job, cands if index is None else index.candidates(ready), ready)
        s = fa[g[0]] if len(g) == 1 else rep.group_free(g)
        a = rep.place(job, g, s if s > ready else ready)  # its default start, max(ready, free)
        for index in indexes:
            index.touch(g)
        if templates is not None:
            touched.extend(g)
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


def _index_for(rep: Replay, cands: list[Group], key: tuple, index_by_list: dict[tuple, GroupIndex],
               indexes: list[GroupIndex], templates: IndexTemplates | None,
               touched: list[str]) -> GroupIndex | None:
    """The candidate index of the list ``cands``, named ``key`` (("groups", TP, memory MiB):
    an endpoint's aligned groups, shared by the endpoints of that TP and memory; ("kind",
    kind): a job kind with helpers, its own filtered list), or None when the list is
    scanned whole (:func:`placement_index.enabled`); cloned from ``templates`` when given
    (``touched``: the GPUs ``rep`` placed on so far). (Before, a kind with helpers could
    share a plain list's index, and looking its name up as an endpoint raised KeyError.)"""
    if not placement_index.enabled(len(cands)):
        return None
    index = index_by_list.get(key)
    if index is None:
        index = GroupIndex(rep, cands) if templates is None else templates.index(key, rep, cands, touched=touched)
        index_by_list[key] = index
        indexes.append(index)
    return index


def fifo(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    state = with_rule(state, "fifo")  # it stops displaced sleepers (issue 20)
    return evaluate(construct("fifo", fifo_order(batch), state, "free"), batch, state, "fifo")


def min_evict(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    state = with_rule(state, "min-evict")  # it stops displaced sleepers (issue 20)
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


def member_builders(batch: Sequence[PlanJob], state: FleetState,
                    objective: str = "weighted_completion", skip_same: bool = False) -> dict[str, Builder]:
    """Member name -> its construction, given a bound on the score of ``objective``:
    (assignments, the replay that placed them), None when pruned or skipped. ``skip_same``
    (:func:`portfolio`; ``partition`` built before ``partition-spill``): ``partition``'s
    turn builds the ``partition-spill`` construction first; when no job spilled
    (:func:`makespan.planner.partition.partition_built`'s ``report``) it is ``partition``'s
    plan, and ``partition-spill``, the same plan, which loses the tie to ``partition``, is
    skipped (None); else ``partition`` is built as well and ``partition-spill``'s turn
    returns the construction already built (built under a bound no lower than its own:
    a plan that bound did not prune is one its own bound prunes only if it cannot win)."""
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
    templates = IndexTemplates(state)  # candidate indexes of the state, built once for all members
    out: dict[str, Builder] = {
        n: partial(construct_built, o, state, r, p, a, 1.0, g, objective=objective, templates=templates)
        for n, o, r, p, a, g in specs}
    shared: dict = {}  # the batch's allocation (computed once for both), partition's spill report
    for name, spill in (("partition", False), ("partition-spill", True)):
        out[name] = partial(_partition, batch, state, spill, objective, shared, templates, skip_same)
    return out


def _partition(batch: Sequence[PlanJob], state: FleetState, spill: bool, objective: str,
               shared: dict, templates: IndexTemplates, skip_same: bool,
               bound: float) -> tuple[list[Assignment], Replay] | None:
    if "alloc" not in shared:
        shared["alloc"] = allocate(batch, state)
    alloc = shared["alloc"]
    if alloc is None:
        return None
    if skip_same and spill and "spill" in shared:  # built at partition's turn (member_builders)
        built, spilled = shared["spill"]
        return built if spilled else None
    if skip_same and not spill:
        report: dict[str, bool] = {}
        built = partition_built(batch, state, True, bound=bound, objective=objective, alloc=alloc,
                                templates=templates, report=report)
        shared["spill"] = (built, report["spilled"])
        if not report["spilled"]:
            return built  # partition's own construction, placement for placement
    return partition_built(batch, state, spill, bound=bound, objective=objective, alloc=alloc, templates=templates)


def members(batch: Sequence[PlanJob], state: FleetState) -> list[Plan]:
    """Every portfolio member, evaluated, in :data:`MEMBERS` order (the baselines are
    members too; ``partition`` members are absent when the fleet cannot hold them); each
    scored from the replay that built it (:func:`makespan.planner.evaluator.evaluate_built`: the
    plan ``evaluate(..., check_times=False)`` gives)."""
    out = []
    for name, build in member_builders(batch, state).items():
        built = build(bound=math.inf)
        if built is not None:
            out.append(evaluate_built(built[0], built[1], batch, state, name))
    return sorted(out, key=lambda p: MEMBERS.index(p.policy))


def _same_as_earlier(batch: Sequence[PlanJob], state: FleetState) -> list[str]:
    """Members that build the same plan as a member earlier in :data:`MEMBERS` on this
    batch, so they cannot be selected (ties go to the earlier one): ``ta-fifo`` when the
    FIFO order is the WSPT order (``ta-wspt``'s construction, same rule and arguments)."""
    same_order = [j.id for j in wspt_order(batch, state.endpoints)] == [j.id for j in fifo_order(batch)]
    return ["ta-fifo"] if same_order else []


def portfolio(batch: Sequence[PlanJob], state: FleetState) -> Plan:
    """Best-scored member (ties: first in :data:`MEMBERS`); ``stats['member']`` is the
    winner's index in :data:`MEMBERS`. The same plan as the best of :func:`members`, built
    in :data:`BUILD_ORDER` with each construction stopped once it provably scores above
    the best so far (:class:`makespan.planner.list_schedule.Prune`)."""
    builders = member_builders(batch, state, skip_same=True)
    for name in _same_as_earlier(batch, state):
        builders.pop(name, None)
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
    # the winner goes through the evaluator's own replay (every plan returned is one the
    # evaluator replayed; the members were scored from their constructions' replays)
    try:
        out = evaluate(best.assignments, batch, state, "portfolio")
    except InfeasiblePlan:  # an order-dependent transition (a host RAM budget): re-timed in start order
        retimed = evaluate_retimed(best.assignments, batch, state, "portfolio")
        if retimed is None:
            raise
        out = retimed
    out.stats["member"] = float(rank[1])
    return out
