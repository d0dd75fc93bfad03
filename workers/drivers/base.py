"""The endpoint driver interface and the endpoint instance record.

A driver starts, stops, probes and (where the server supports it) sleeps and wakes
endpoint instances. Drivers: ``simulated`` (a time-scaled sleep, no process),
``process`` (a real command under a free port with ``CUDA_VISIBLE_DEVICES`` set from
the GPU UUIDs) and ``vllm`` (builds ``vllm serve`` and runs it as a process); more come
from the ``makespan.drivers`` entry-point group (:mod:`makespan.driver_registry`, and
docs/drivers.md for writing one). Each driver class says what it can do in a frozen
:class:`DriverCapabilities`; callers ask those, never the name. Every driver failure is
raised as :class:`makespan.errors.PhaseError` naming the endpoint.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from makespan.driver_registry import DriverCapabilities, DriverContext
from makespan.models import EndpointSpec


def machine_name() -> str:
    """This machine's name as endpoint instances record it (:attr:`Instance.machine`):
    ``MAKESPAN_MACHINE`` when set (containers that share one network and process namespace,
    e.g. the compose file's gpu-worker and observer, set the same value), else the OS host
    name."""
    return os.environ.get("MAKESPAN_MACHINE", "").strip() or socket.gethostname()


@dataclass
class Instance:
    """One running copy of an endpoint on a GPU group.

    Attributes:
        id: random hex id (the instance registry key, see :mod:`makespan.workers.observer`).
        endpoint: endpoint name; ``gpus``: GPU UUIDs; ``host``: host name (may be "").
        driver: the driver name that started it; ``time_scale``: wall s per workload s.
        url: base URL (``http://127.0.0.1:PORT``) for process/vllm, else None.
        pid / port / log_path: process details (process/vllm), else None.
        health_path: HTTP path probed by :meth:`EndpointDriver.health`.
        started_at: unix seconds when it passed its health check.
        owner_pid: pid of the GPU worker process that spawned it (a process whose owner
            is gone is an orphan unless a lease or a resident marker still names it:
            :mod:`makespan.workers.orphans`).
        machine: the name (:func:`machine_name`) of the machine whose process table holds
            ``pid`` and whose loopback ``url`` answers ("": unknown, or no process); the
            health observer probes and restarts only its own machine's.
        sleep_level: the vLLM sleep level it sleeps at (1 or 2) when read back from the
            registry asleep or waking; None: awake, or not known (a driver's ``wake`` may use
            it: the simulated driver wakes a level-2 sleeper at ``wake_level2_s``).
        proc: the :class:`subprocess.Popen` when this process spawned it (not serialised).
    """

    endpoint: str
    gpus: list[str]
    driver: str
    host: str = ""
    time_scale: float = 1.0
    url: str | None = None
    pid: int | None = None
    port: int | None = None
    log_path: str | None = None
    health_path: str = "/health"
    started_at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    stopped: bool = False
    owner_pid: int | None = None
    machine: str = ""
    sleep_level: int | None = None
    proc: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), list) else v)
                for f in fields(self) if f.name != "proc"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Instance:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "proc"}
        return cls(**known)


@dataclass(frozen=True)
class StopReport:
    """What stopping an instance's processes took (:meth:`ProcessDriver.stop`).

    Attributes:
        pid: the instance's leader pid (its process group and session id); None: no process.
        terminated: pids that ended after SIGTERM within the grace period.
        killed: ``(pid, command line)`` of every process still alive after the grace
            period, each sent SIGKILL (empty when the group ended on SIGTERM).
        left: pids still alive after SIGKILL and its wait (should be empty; a process in
            uninterruptible sleep, e.g. a GPU driver call, can linger).
    """

    pid: int | None = None
    terminated: tuple[int, ...] = ()
    killed: tuple[tuple[int, str], ...] = ()
    left: tuple[int, ...] = ()

    @property
    def clean(self) -> bool:
        """True when the whole group ended on SIGTERM (nothing killed, nothing left)."""
        return not self.killed and not self.left


class NoLaunchOptions(BaseModel):
    """The ``options_model`` of a driver with no ``launch`` keys of its own (it reads only
    the common ones of :class:`makespan.models.LaunchSpec`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@runtime_checkable
class EndpointDriver(Protocol):
    """What every endpoint driver provides.

    Class attributes: ``name`` (what a fleet file's ``launch.driver`` says),
    ``capabilities`` (:class:`DriverCapabilities`: what callers may ask of it) and
    ``options_model`` (a pydantic model, ``extra="forbid"``, of the driver's own
    ``launch`` keys beyond the common ones; :class:`NoLaunchOptions` when none; an
    endpoint reads its validated options with ``endpoint.launch.driver_options()``). The
    registry makes a driver as ``cls(context=DriverContext | None, **options)``.

    ``is_alive(instance)``: False only when the driver knows the instance's process has
    ended (meaningful where ``capabilities.reports_alive``; otherwise "not stopped").

    ``start`` blocks until the instance passes its health check (a driver that spawns a
    process calls ``on_spawn(instance)`` as soon as it exists, and again with the same
    instance when it spawns it anew, e.g. on another port) and raises
    :class:`makespan.errors.PhaseError` with the reason when it does not (timeout, early
    exit). ``stop`` is idempotent.

    Sleep mode (vLLM's, see :mod:`makespan.workers.drivers.vllm`): ``sleep(instance,
    level)`` puts a running instance to sleep at ``level`` 1 (weights kept in host RAM)
    or 2 (weights dropped) and returns when it sleeps; ``wake(instance)`` returns when
    it serves again; ``is_sleeping(instance)`` asks it. Each raises PhaseError where the
    endpoint or driver has no sleep mode, or the server refuses or does not answer (the
    GPU worker then falls back to stop, or to stop + cold start for a wake).
    """

    name: ClassVar[str]
    capabilities: ClassVar[DriverCapabilities]
    options_model: ClassVar[type[BaseModel]]

    def start(self, endpoint: EndpointSpec, gpus: list[str], time_scale: float = 1.0,
              host: str = "", on_spawn: Any = None) -> Instance: ...

    def stop(self, instance: Instance) -> StopReport | None: ...

    def health(self, instance: Instance) -> bool: ...

    def is_alive(self, instance: Instance) -> bool: ...

    def sleep(self, instance: Instance, level: int = 1) -> None: ...

    def wake(self, instance: Instance) -> None: ...

    def is_sleeping(self, instance: Instance) -> bool: ...


__all__ = ["DriverCapabilities", "DriverContext", "EndpointDriver", "Instance", "NoLaunchOptions", "StopReport"]
