"""The preemption rule (design notes, "Preemption"), pure: no Redis, no clock.

CRITICAL (level 0) preempts HIGH, NORMAL and LOW; HIGH (1) preempts NORMAL and LOW;
NORMAL and LOW never preempt. For one waiting job :func:`choose_preemption` decides
which GPU group to clear and which holders to preempt, or that none should be:

    * no preemption for a job that could start on a free group now (waiting was the
      plan's choice, not a lack of GPUs);
    * none when its earliest group frees within its endpoint's cold start (preempting
      would not start it sooner: the preemptor pays a cold start on the cleared group);
    * a group is a candidate when every GPU of it is either free now or held by a
      preemptable holder (a job still before the end of its workload, not a restore) of a
      strictly lower level, and at least one is held (a group partly free and partly held
      by lower-priority work is a candidate); among candidates the one whose victims have
      the smallest total priority weight wins (the first such group in ``groups`` order on
      ties).

Bounded (docs/planner.md, "Guarantees"): a holder is preemptable only while its job was
preempted fewer than the budget's times (``Settings.preemption_budget``, default
:data:`DEFAULT_PREEMPTION_BUDGET`) and has run at least the minimum runtime
(``Settings.preemption_min_runtime_s``, default :data:`DEFAULT_MIN_RUNTIME_S`);
:func:`victim_allowed` is that test, applied by every caller where it builds holders.

The caller then preempts the victims and gives the group to the job at once, so a
victim is never re-leased the GPUs it lost before its preemptor starts. Used by the live
planner worker (:mod:`makespan.workers.preemption`, holders are leases) and the simulator
(:mod:`makespan.planner.simulator`, holders are committed jobs).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from makespan.priorities import Priority

Group = tuple[str, ...]
DEFAULT_PREEMPTION_BUDGET = 2  # times one job may be preempted (Settings.preemption_budget)
DEFAULT_MIN_RUNTIME_S = 0.0  # s a job runs before it may be preempted (Settings.preemption_min_runtime_s)


def victim_allowed(preemptions: int, ran_s: float, budget: int = DEFAULT_PREEMPTION_BUDGET,
                   min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> bool:
    """Whether a running job may be preempted (module doc, "Bounded"): it was preempted
    ``preemptions`` times before (< ``budget``) and has held its GPUs for ``ran_s`` s
    (≥ ``min_runtime_s``). A ``budget`` < 0 means no budget."""
    return (budget < 0 or preemptions < budget) and ran_s >= min_runtime_s - 1e-9


@dataclass(frozen=True)
class Holder:
    """What holds a GPU now.

    Attributes:
        id: lease id (live) or job id (simulator).
        priority: level index 0..3 of the job holding it (0 = CRITICAL).
        preemptable: False for a restore, a job whose workload already ran (it only has
            to clear), or anything else that must not be cut short.
    """

    id: str
    priority: int
    preemptable: bool = True


@dataclass(frozen=True)
class Preemption:
    """The decision for one job: clear ``group`` by preempting ``victims`` (holder ids,
    sorted); ``cost`` = Σ victim priority weights."""

    group: Group
    victims: tuple[str, ...]
    cost: float


def may_preempt(level: int, other: int) -> bool:
    """Design notes: CRITICAL preempts HIGH/NORMAL/LOW, HIGH preempts NORMAL/LOW
    (:meth:`makespan.priorities.Priority.may_preempt` on level indices)."""
    return 0 <= level <= 3 and 0 <= other <= 3 and Priority(level).may_preempt(Priority(other))


def choose_preemption(level: int, groups: Sequence[Group], busy: Collection[str], free_at: Mapping[str, float],
                      now_s: float, cold_start_s: float,
                      holders: Mapping[str, Holder | None]) -> Preemption | None:
    """The group to clear for a waiting job of ``level``, or None (module rules).

    Args:
        level: the waiting job's priority level index (0 = CRITICAL).
        groups: the aligned GPU groups that can serve its endpoint.
        busy: GPUs held or taken now; a group with none of them is free now.
        free_at: GPU uuid -> time it frees, s (absent: ``now_s``).
        now_s: the planning time, s.
        cold_start_s: the job's endpoint cold start, s.
        holders: GPU uuid -> what holds it now (None or absent: nothing preemptable
            holds it, e.g. it was free or was taken in this planning step; a GPU not in
            ``busy`` is free whatever it says).
    """
    if level > 1 or not groups:
        return None
    if any(not any(u in busy for u in g) for g in groups):
        return None
    soonest = min(max(free_at.get(u, now_s) for u in g) for g in groups)
    if soonest - now_s <= cold_start_s:
        return None
    best: Preemption | None = None
    for g in groups:
        hs = [holders.get(u) for u in g if u in busy]  # the free GPUs of a partly free group need no victim
        if any(h is None or not h.preemptable or not may_preempt(level, h.priority) for h in hs):
            continue
        victims = {h.id: h.priority for h in hs if h is not None}
        cost = sum(float(Priority(p).weight) if 0 <= p <= 3 else 1.0 for p in victims.values())
        if best is None or cost < best.cost:
            best = Preemption(g, tuple(sorted(victims)), cost)
    return best
