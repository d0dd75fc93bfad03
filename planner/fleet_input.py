"""What the planner reads from a fleet description and from a trace row.

The planner takes a fleet file's contents and trace rows without importing the classes
that parse them (the application's :class:`makespan.models.FleetSpec` and
:class:`makespan.traces.TraceJob` have these shapes): the planner sits below the
application in the import layers (pyproject's ``[tool.importlinter]``). Members are
read-only properties, so frozen models and tuples satisfy them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from makespan.priorities import Priority


class GpuDescription(Protocol):
    """One GPU of a host."""

    @property
    def uuid(self) -> str: ...
    @property
    def index(self) -> int:
        """CUDA device index on its host."""
    @property
    def memory_mib(self) -> int: ...


class HostDescription(Protocol):
    """A GPU host and its GPUs."""

    @property
    def name(self) -> str: ...
    @property
    def gpus(self) -> Sequence[GpuDescription]: ...


class SetPointDescription(Protocol):
    """A GPU group of a host where an endpoint instance runs at the set point."""

    @property
    def host(self) -> str: ...
    @property
    def gpus(self) -> Sequence[int]:
        """CUDA indices on that host."""


class EndpointDescription(Protocol):
    """A model server definition: sizes in MiB, times in s (``wake_s`` None: no sleep mode)."""

    @property
    def name(self) -> str: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def memory_mib_per_gpu(self) -> int: ...
    @property
    def cold_start_s(self) -> float: ...
    @property
    def evict_s(self) -> float: ...
    @property
    def wake_s(self) -> float | None: ...
    @property
    def slots(self) -> int: ...
    @property
    def asleep_gpu_mib(self) -> int: ...
    @property
    def asleep_ram_mib(self) -> int: ...
    @property
    def set_point(self) -> Sequence[SetPointDescription]: ...


class FleetDescription(Protocol):
    """A fleet file's contents: hosts, endpoints by name, and the set point."""

    @property
    def hosts(self) -> Sequence[HostDescription]: ...
    @property
    def endpoints(self) -> Mapping[str, EndpointDescription]: ...

    def set_point_by_gpu(self) -> dict[str, str]:
        """GPU UUID -> endpoint name resident at the set point."""
        ...

    def host_ram_budgets(self) -> dict[str, int]:
        """Host name -> RAM sleepers may hold there, MiB (hosts that give one)."""
        ...


class TraceRow(Protocol):
    """One trace row mapped onto a fleet; ``submit_s`` relative to the window start."""

    @property
    def id(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def priority(self) -> Priority: ...
    @property
    def submit_s(self) -> float: ...
    @property
    def service_s(self) -> float: ...
