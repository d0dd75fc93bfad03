"""Prewarm by wake (issue 20 point 5): wake a sleeping instance on an idle GPU group
ahead of forecast demand.

A cold prewarm (load a model nobody asked for yet) was tried and reverted: it held GPUs
the next arrivals wanted (bench/RESULTS.md, "prewarming"). With sleepers a prewarm is a
*wake*: seconds instead of a cold start, and cheap to undo, because what it displaces is
put to sleep (only groups whose resident, if any, has a sleep mode qualify) and the woken
instance goes back to sleep when a job displaces it again.

:func:`prewarm_wakes` is the rule, one for the simulator and the live planner worker
(``Settings.prewarm``, ``MAKESPAN_PREWARM``): for each endpoint with a sleep mode, in
decreasing order of its share of recent demand (``FleetState.demand_share``), that has
no queued job (the plan already places those) and no instance resident anywhere, the
group where it sleeps on every GPU that is idle (free before ``until_s``, no job or
restore of the current plan on any of its GPUs, no GPU the set point of another
endpoint: the set-point restore would undo it) and whose resident is nothing or an
endpoint with a sleep mode, a smaller share of recent demand and no queued job; the
earliest such group, one prewarm per endpoint. The wake itself is the restore
transition (:meth:`makespan.planner.replay.Replay.restore`): evict what is resident (the
transition choice decides its sleep level), then wake.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from makespan.planner.model import FleetState


@dataclass(frozen=True)
class Prewarm:
    """One prewarm: wake ``endpoint`` on ``gpus`` (GPU uuids) from ``start_s`` (s, the
    planning clock: when the group is free, at the earliest the state's ``now_s``)."""

    endpoint: str
    gpus: tuple[str, ...]
    start_s: float


def prewarm_wakes(state: FleetState, planned_gpus: Collection[str], queued_endpoints: Collection[str],
                  until_s: float) -> list[Prewarm]:
    """The prewarms of ``state`` (module doc's rule), in decreasing share of demand.

    Args:
        state: the fleet now (``free_at``, ``resident``, ``asleep``, ``demand_share``).
        planned_gpus: GPUs any job or restore of the current plan uses (never prewarmed).
        queued_endpoints: endpoints with a queued job (never prewarmed, never displaced).
        until_s: a group must be free before this time (s): the next planning point.

    Returns:
        at most one :class:`Prewarm` per endpoint, on disjoint groups; empty when no
        endpoint has a share of recent demand."""
    share = state.demand_share
    residents = {e for e in state.resident.values() if e is not None}
    out: list[Prewarm] = []
    used: set[str] = set(planned_gpus)
    for name in sorted(share, key=lambda e: (-share[e], e)):
        ep = state.endpoints.get(name)
        if ep is None or ep.wake_s is None or share[name] <= 0 or name in queued_endpoints or name in residents:
            continue
        best: tuple[float, tuple[str, ...]] | None = None
        for group in state.groups(ep.tp, ep.memory_mib):
            if used.intersection(group) or not all(name in state.asleep.get(u, ()) for u in group):
                continue
            if any(state.set_point.get(u, name) != name for u in group):
                continue
            start_s = max([state.now_s, *(state.free_at.get(u, state.now_s) for u in group)])
            if start_s >= until_s or not _displaceable(state, group, share[name], queued_endpoints):
                continue
            if best is None or start_s < best[0]:
                best = (start_s, group)
        if best is not None:
            out.append(Prewarm(name, best[1], best[0]))
            used.update(best[1])
    return out


def _displaceable(state: FleetState, group: tuple[str, ...], share: float, queued: Collection[str]) -> bool:
    """True if every resident of ``group`` may be put to sleep for a prewarm of an endpoint
    with ``share`` of recent demand: nothing, or an endpoint with a sleep mode, a smaller
    share and no queued job."""
    for u in group:
        resident = state.resident.get(u)
        if resident is None:
            continue
        ep = state.endpoints.get(resident)
        if ep is None or ep.wake_s is None or resident in queued or state.demand_share.get(resident, 0.0) >= share:
            return False
    return True
