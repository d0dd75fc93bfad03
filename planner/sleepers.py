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

from collections.abc import Mapping


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
