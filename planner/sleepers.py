"""What sleeping instances hold (issue 20 point 2), one rule for the planner and the GPU
worker.

A sleeping instance (vLLM sleep mode) still holds a little GPU memory on each of its
GPUs (``EndpointModel.asleep_gpu_mib``: CUDA context, buffers) and, at level 1, its
weights in its host's RAM (``asleep_ram_mib``), against the host's budget for sleepers
(``FleetState.host_ram_mib``, the fleet file's ``host_memory_mib``):

* an instance is put to sleep only if its RAM fits the host's budget beside the
  sleepers already there and its GPU memory fits beside the endpoint loaded in its place
  and the other sleepers of those GPUs; else it is stopped (:func:`may_sleep`);
* loading an endpoint on a GPU stops the sleepers that no longer fit beside it, largest
  first (ties: the name last in sort order first) (:func:`sleepers_kept`).

A stopped sleeper is simply not asleep any more: its next load is a cold start, which is
how a plan pays for it (the evaluator replays the same rule through
:class:`makespan.planner.replay.Replay`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from makespan.planner.model import FleetState, PlanJob


def sleepers_kept(room_mib: float, sleepers: Mapping[str, float]) -> frozenset[str]:
    """The sleepers (endpoint -> GPU MiB each holds) kept on one GPU with ``room_mib`` MiB
    left beside its resident: the largest are stopped first until the rest fit."""
    kept = dict(sleepers)
    while kept and sum(kept.values()) > room_mib:
        del kept[max(kept, key=lambda e: (kept[e], e))]
    return frozenset(kept)


def may_sleep(ram_used_mib: float, ram_budget_mib: float | None, ram_mib: float,
              gpu_room_mib: float, gpu_mib: float) -> bool:
    """True if an instance holding ``ram_mib`` of host RAM and ``gpu_mib`` per GPU may go
    to sleep: the host's sleepers then hold at most ``ram_budget_mib`` (None: no budget)
    and its GPUs have ``gpu_room_mib`` left for it (the least over its GPUs)."""
    if ram_budget_mib is not None and ram_used_mib + ram_mib > ram_budget_mib:
        return False
    return gpu_mib <= gpu_room_mib


# The transition choice (issue 20 point 3) -------------------------------------------------

HOLD_COST_PER_GIB = 0.1
"""Score a sleeper pays per GiB it holds (host RAM + GPU memory over its GPUs), weight·s:
what keeps a sleeper that will not be needed from holding memory another could use. At
0.1 a level-1 sleeper of a 20 GiB model costs 2 weight·s, below the saving of one LOW
job (weight 1) that wakes it instead of a cold start longer than its wake by 2 s."""


SET_POINT_NEED_WEIGHT = 1.0
"""Need weight (as a LOW job's weight) a displaced instance adds to its forecast when one of
the GPUs it leaves has it as its set point: its set-point restore will load it there again,
so without other demand it still sleeps (a restore that wakes it, 0.7 s in the demo fleet,
instead of a cold start, 3.4 s; minutes for a real model) when what it holds fits. Before, such
an instance was stopped when no job of it was forecast."""


def forecast_weight(endpoint: str, at_s: float, now_s: float, demand: Mapping[str, float],
                    upcoming: Mapping[str, tuple[tuple[float, float], ...]]) -> float:
    """The weight of the work expected to need ``endpoint`` again after ``at_s`` (s): its
    recent demand (``FleetState.demand``, weight per planning window) plus the batch's
    jobs of it (``FleetState.upcoming``) queued at ``now_s`` or released at or after
    ``at_s``. A queued job counts for the whole plan: where it is placed is the plan's
    business, and counting it only until placed would make the choice depend on the
    order a construction places jobs in (the evaluator replays in start order)."""
    weight = demand.get(endpoint, 0.0)
    for release_s, job_weight in upcoming.get(endpoint, ()):
        if release_s <= now_s or release_s >= at_s:
            weight += job_weight
    return weight


def choose_level(options: tuple[tuple[int, float, int], ...], cold_start_s: float, gpu_mib_total: float,
                 need_weight: float, fits: Callable[[int, float], bool]) -> int:
    """The transition of one displaced instance: a sleep level of ``options`` (``(level,
    wake_s, host RAM MiB)``) or 0 (stop). Each level that ``fits(level, ram_mib)`` scores
    ``need_weight × (cold_start_s − wake_s) − HOLD_COST_PER_GIB × (ram_mib +
    gpu_mib_total) / 1024`` (weight·s: the cold start a wake saves the work expected to
    need it, against the memory it holds; ``gpu_mib_total``: GPU MiB it holds over all its
    GPUs); the best level scoring > 0 wins (ties: the first in ``options``), else 0: a
    model never needed again is stopped, and one whose level-1 RAM does not fit the
    host's budget sleeps at level 2 if that still pays, else stops."""
    best_level, best_score = 0, 0.0
    for level, wake_s, ram_mib in options:
        if not fits(level, ram_mib):
            continue
        score = need_weight * (cold_start_s - wake_s) - HOLD_COST_PER_GIB * (ram_mib + gpu_mib_total) / 1024.0
        if score > best_score:
            best_level, best_score = level, score
    return best_level


def with_upcoming(state: FleetState, batch: Iterable[PlanJob]) -> FleetState:
    """``state`` with ``upcoming`` filled from ``batch`` (endpoint -> sorted ``(release_s,
    weight)``) when some endpoint has ``sleep_options`` and it is not filled yet; else
    ``state`` itself (plans on fleets without a choice stay as they were)."""
    if state.upcoming or not any(e.sleep_options for e in state.endpoints.values()):
        return state
    out: dict[str, list[tuple[float, float]]] = {}
    for job in batch:
        out.setdefault(job.endpoint, []).append((job.release_s, job.weight))
    return replace(state, upcoming={e: tuple(sorted(v)) for e, v in out.items()})


def with_rule(state: FleetState, policy: str) -> FleetState:
    """``state`` with the transition rule of ``policy``: ``"stop"`` for the fixed baselines
    (:data:`STOPPING_POLICIES`) on fleets with ``sleep_options``; else ``state`` itself."""
    if policy in STOPPING_POLICIES and state.transition_rule != "stop" and any(
            e.sleep_options for e in state.endpoints.values()):
        return replace(state, transition_rule="stop")
    return state


STOPPING_POLICIES = frozenset({"fifo", "min-evict"})
"""Policies that do not choose a transition: they stop every displaced instance of an
endpoint with ``sleep_options`` (issue 20: "min-evict and fifo stay as defined")."""
