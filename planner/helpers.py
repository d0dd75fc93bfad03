"""Helper endpoints placed with their job (issue 16): the price and the memory rule.

A job of a ``@makespan.workload(helpers=(...))`` function needs, beside its main
endpoint, one instance of each helper endpoint on its own GPUs: the GPU worker's start
phase starts each helper, one after the other, on the first ``tp`` GPUs of the job's
group (the helper's own tensor-parallel size) after the main endpoint is ready, and the
clear phase stops them after execute. So, as the plan sees it:

* **price**: every placement of such a job pays the sum of its helpers' cold starts
  after the main endpoint's transition (:func:`helpers_start_s`); the clear phase stopped
  the last job's helpers, so none is resident when the next job starts
  (:meth:`makespan.planner.replay.Replay.place` adds it to the transition);
* **memory**: GPU ``i`` of the group (in group order) holds the main endpoint and every
  helper whose tensor-parallel size is above ``i`` (:func:`need_mib`); a group fits when
  each of its GPUs has that much memory (:func:`group_fits`). A helper wider than the
  main endpoint's group fits nowhere. Sleepers on the group stay only while they fit
  beside that sum (:meth:`makespan.planner.replay.Replay.place`; the GPU worker's start
  phase stops the others before the helpers start, with :func:`stacked_mib`).

Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from makespan.planner.model import EndpointModel, PlanJob


def helpers_start_s(helpers: Sequence[str], endpoints: Mapping[str, EndpointModel]) -> float:
    """Seconds the start phase spends starting ``helpers`` (one after the other): the sum
    of their cold starts, s. Names the fleet does not have count 0 (the submit refuses
    them; a fleet changed since is the GPU worker's error to report)."""
    return sum(endpoints[name].cold_start_s for name in helpers if name in endpoints)


def need_mib(main: EndpointModel, helpers: Sequence[str], endpoints: Mapping[str, EndpointModel]) -> tuple[int, ...]:
    """GPU memory the job needs on each GPU of its group, MiB, in group order: ``main``'s
    ``memory_mib`` plus that of each helper whose tensor-parallel size covers the
    position. Length ``main.tp``; a helper wider than ``main.tp`` is not counted here
    (:func:`too_wide` names it)."""
    return stacked_mib(main.memory_mib, main.tp,
                       [(endpoints[name].memory_mib, endpoints[name].tp) for name in helpers if name in endpoints])


def stacked_mib(main_mib: int, main_tp: int, helpers: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """:func:`need_mib` from figures: the main endpoint's MiB per GPU and tensor-parallel
    size, and each helper's (MiB per GPU, tensor-parallel size); the GPU worker's form (its
    fleet file's endpoint specs). Length ``main_tp``, MiB per GPU in group order."""
    need = [main_mib] * main_tp
    for mib, tp in helpers:
        for position in range(min(tp, main_tp)):
            need[position] += mib
    return tuple(need)


def too_wide(main: EndpointModel, helpers: Sequence[str], endpoints: Mapping[str, EndpointModel]) -> list[str]:
    """The helpers whose tensor-parallel size exceeds ``main.tp`` (they cannot start on
    the job's GPUs)."""
    return [name for name in helpers if name in endpoints and endpoints[name].tp > main.tp]


def group_fits(group: Sequence[str], need: Sequence[int], memory_of: Mapping[str, int]) -> bool:
    """Whether every GPU of ``group`` (uuids, in group order) has the memory ``need``
    gives for its position (:func:`need_mib`), MiB."""
    return len(group) == len(need) and all(memory_of[u] >= mib for u, mib in zip(group, need))


def fitting_groups(groups: Sequence[tuple[str, ...]], main: EndpointModel, helpers: Sequence[str],
                   endpoints: Mapping[str, EndpointModel], memory_of: Mapping[str, int]) -> list[tuple[str, ...]]:
    """The groups of ``groups`` (``main``'s aligned groups, GPU uuids in group order) where
    ``main`` and its ``helpers`` fit (:func:`need_mib`, :func:`group_fits`; ``memory_of``:
    GPU uuid -> memory, MiB), in the same order; empty when a helper is wider than ``main``
    (:func:`too_wide`). The tick's rule (:meth:`makespan.planner.replay.Replay.job_groups`)
    and the critical lane's."""
    if too_wide(main, helpers, endpoints):
        return []
    need = need_mib(main, helpers, endpoints)
    return [group for group in groups if group_fits(group, need, memory_of)]


def held_s(job: PlanJob, endpoints: Mapping[str, EndpointModel]) -> float:
    """Seconds ``job`` holds its group after its main endpoint is ready: its helpers'
    start (:func:`helpers_start_s`) plus its ``service_s``, s."""
    return job.service_s + helpers_start_s(job.helpers, endpoints) if job.helpers else job.service_s
