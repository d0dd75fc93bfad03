"""What a phase task carries (:class:`PhaseContext`, the JSON task argument) and the
resident-instance value ``endpoint@uuid1,uuid2`` of ``P:resident:{uuid}``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from makespan.workers.drivers.base import Instance
from makespan.workers.leases import Lease


# the registry's instances on a lease's GPUs with their states, as a caller already read them
# (the warm path's begin step: makespan.store.JobStore.begin_warm); None: read where needed
Registered = list[tuple[Instance, str]] | None


@dataclass
class PhaseContext:
    """Everything a phase task needs; travels as the JSON task argument."""

    lease_id: str
    token: int
    gpus: list[str]
    host: str
    kind: str  # "job" or "restore"
    endpoint: str
    job_id: str = ""
    priority: str = ""
    service_s: float = 0.0
    payload: dict | None = None
    traceparent: str = ""
    submitted_at: float = 0.0
    # the plan's transition choice (issue 20 point 3, ``Assignment.sleep_levels``): evicted
    # endpoint -> sleep level 1 or 2, 0 = stop; an endpoint absent: the fleet file's sleep_level
    sleep_levels: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseContext:
        return cls(**d)

    @property
    def lease(self) -> Lease:
        return Lease(self.lease_id, int(self.token), tuple(self.gpus))


def instance_value(endpoint: str, gpus: list[str] | tuple[str, ...]) -> str:
    """Value of ``P:resident:{uuid}``: ``endpoint@uuid1,uuid2`` names one instance."""
    return f"{endpoint}@{','.join(gpus)}"


def parse_instance(value: str | None) -> tuple[str, list[str]] | None:
    if not value:
        return None
    ep, _, gpus = value.partition("@")
    return ep, gpus.split(",") if gpus else []
