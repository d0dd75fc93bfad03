"""Where a CRITICAL job goes the moment it arrives, pure: the critical lane's choice.

The live worker's critical lane (:mod:`makespan.workers.critical_lane`) places a CRITICAL
job without waiting for the tick's plan (issue 21 point 2). It reads the GPUs' leases and
residents and asks :func:`place_critical` for one of, in this order:

1. **warm**: a free aligned group whose GPUs hold exactly the job's endpoint instance (the
   job skips its cold start);
2. **cold**: a free aligned group, preferring one that the last published plan does not
   start anything on now (``planned``), then one with the fewest resident instances to
   evict, then fleet order;
3. **preempt**: the group :func:`makespan.planner.preemption.choose_preemption` clears
   (strictly lower-priority, preemptable job leases; none when a group frees within the
   endpoint's cold start, where waiting is as fast as preempting).

None when none applies: the job stays queued for the tick. The tick's plan of the same
moment may have counted on the GPUs taken here; its lease there then fails and that job
waits for the next tick (the reconciliation: the next snapshot reads the new lease).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from makespan.planner.preemption import Holder, choose_preemption

Group = tuple[str, ...]

__all__ = ["CriticalPlacement", "place_critical"]


@dataclass(frozen=True)
class CriticalPlacement:
    """A CRITICAL job's placement by the critical lane.

    Attributes:
        gpus: the aligned group (GPU UUIDs, fleet order).
        load: ``"warm"`` (its instance is resident on exactly ``gpus``) or ``"cold_start"``.
        victims: lease ids to preempt before the group is leased (empty: it is free).
    """

    gpus: Group
    load: Literal["warm", "cold_start"]
    victims: tuple[str, ...] = ()


def place_critical(groups: Sequence[Group], unavailable: Collection[str], is_warm: Callable[[Group], bool],
                   residents: Mapping[str, str | None], planned: Collection[str],
                   free_at: Mapping[str, float], now_s: float, cold_start_s: float,
                   holders: Mapping[str, Holder | None] | None) -> CriticalPlacement | None:
    """The critical lane's placement of one CRITICAL job (module doc), or None.

    Args:
        groups: the aligned GPU groups that can serve the job's endpoint (fleet order).
        unavailable: GPUs a lease holds now or of a host without a live GPU worker.
        is_warm: whether a group holds exactly the job's endpoint instance.
        residents: GPU uuid -> its resident instance (None or absent: nothing loaded).
        planned: GPUs the last published plan starts a job on now (avoided when possible).
        free_at: GPU uuid -> planned end of its lease, workload s (absent: ``now_s``).
        now_s: the workload clock, s.
        cold_start_s: the job's endpoint cold start, s.
        holders: GPU uuid -> its lease as a preemption candidate; None: do not preempt
            (the caller reads the holders only when no group is free).
    """
    free = [group for group in groups if not any(gpu in unavailable for gpu in group)]
    for group in free:
        if is_warm(group):
            return CriticalPlacement(group, "warm")
    if free:
        order = {group: n for n, group in enumerate(free)}
        best = min(free, key=lambda group: (any(gpu in planned for gpu in group),
                                            sum(1 for gpu in group if residents.get(gpu)), order[group]))
        return CriticalPlacement(best, "cold_start")
    if holders is None:
        return None
    chosen = choose_preemption(0, groups, unavailable, free_at, now_s, cold_start_s, holders)
    if chosen is None:
        return None
    return CriticalPlacement(tuple(chosen.group), "warm" if is_warm(tuple(chosen.group)) else "cold_start",
                             tuple(chosen.victims))
