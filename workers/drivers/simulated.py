"""The simulated driver: transitions are time-scaled sleeps, no process runs.

``start`` sleeps ``cold_start_s × time_scale``; ``stop`` sleeps ``evict_s × time_scale``;
``sleep`` sleeps ``evict_s × time_scale`` (the planner prices a sleep as an evict);
``wake`` sleeps ``wake_s × time_scale`` (``cold_start_s`` when the endpoint has no
``wake_s``; ``wake_level2_s`` when it sleeps at level 2, as this driver put it or as the
registry read it back, ``Instance.sleep_level``, and the endpoint has one). Each duration is multiplied by ``slowdown[host]`` when given (a host whose
disk is slower than the fleet file says: the benches of learned durations use it).
Health is "not stopped", ``is_sleeping`` "slept and not woken" (in this driver object
only: a driver is one worker process's view; so is the level it slept at).

Every duration is spent through the context's ``wait`` (:class:`DriverContext`; default
:func:`time.sleep`): the phase runner passes one that stops when its lease is lost, or
one that only notes the duration where several transitions run as one (an evict).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from makespan.errors import PhaseError
from makespan.models import EndpointSpec
from makespan.workers.drivers.base import DriverCapabilities, DriverContext, Instance, NoLaunchOptions


class SimulatedDriver:
    """Args:
        endpoints: endpoint name -> spec, for the durations of ``stop``/``sleep``/``wake``
            of instances this object did not start (read back from the registry); added
            to ``context.endpoints``.
        slowdown: host name -> factor (> 0) applied to every duration on that host
            (over ``context.slowdown_by_host``).
        context: the registry's :class:`DriverContext` (endpoints, slowdown, wait)."""

    name = "simulated"
    capabilities = DriverCapabilities(spawns_process=False, sleep_levels=(1, 2), reports_alive=False,
                                      min_transition_wall_s=0.0)
    options_model = NoLaunchOptions

    def __init__(self, endpoints: Mapping[str, EndpointSpec] | None = None,
                 slowdown: Mapping[str, float] | None = None, context: DriverContext | None = None) -> None:
        context = context or DriverContext()
        self._specs: dict[str, EndpointSpec] = {**context.endpoints, **(endpoints or {})}
        self._slowdown = {**context.slowdown_by_host, **(slowdown or {})}
        self._wait = context.wait or time.sleep
        self._sleeping: dict[str, int] = {}  # instance id -> the sleep level it was put to

    def duration_s(self, instance_or_host: Instance | str, value_s: float) -> float:
        """``value_s`` (workload s) as this driver takes it on a host: × the host's slowdown."""
        host = instance_or_host if isinstance(instance_or_host, str) else instance_or_host.host
        return value_s * self._slowdown.get(host, 1.0)

    def start(self, endpoint: EndpointSpec, gpus: list[str], time_scale: float = 1.0,
              host: str = "", on_spawn=None) -> Instance:  # no process: nothing to track early
        if len(gpus) != endpoint.tensor_parallel:
            raise PhaseError(f"endpoint {endpoint.name!r}: needs {endpoint.tensor_parallel} GPUs, got {len(gpus)}")
        self._wait(self.duration_s(host, endpoint.cold_start_s) * time_scale)
        self._specs[endpoint.name] = endpoint
        return Instance(endpoint.name, list(gpus), self.name, host=host, time_scale=time_scale)

    def stop(self, instance: Instance) -> None:
        if instance.stopped:
            return
        spec = self._specs.get(instance.endpoint)
        self._wait(self.duration_s(instance, spec.evict_s if spec else 0.0) * instance.time_scale)
        instance.stopped = True
        self._sleeping.pop(instance.id, None)

    def health(self, instance: Instance) -> bool:
        return not instance.stopped

    def is_alive(self, instance: Instance) -> bool:
        """No process: alive while not stopped."""
        return not instance.stopped

    def sleep(self, instance: Instance, level: int = 1) -> None:
        """Sleep ``evict_s`` (scaled). Raises PhaseError: level not 1 or 2, or stopped."""
        if level not in (1, 2):
            raise PhaseError(f"endpoint {instance.endpoint!r}: sleep level must be 1 or 2, got {level}")
        if instance.stopped:
            raise PhaseError(f"endpoint {instance.endpoint!r}: instance {instance.id} is stopped")
        spec = self._specs.get(instance.endpoint)
        self._wait(self.duration_s(instance, spec.evict_s if spec else 0.0) * instance.time_scale)
        self._sleeping[instance.id] = level

    def wake(self, instance: Instance) -> None:
        """Sleep ``wake_s`` (else ``cold_start_s``), or ``wake_level2_s`` when the instance
        sleeps at level 2 (this driver slept it so, or ``instance.sleep_level`` says so) and the
        endpoint has one (scaled). Raises PhaseError when stopped."""
        if instance.stopped:
            raise PhaseError(f"endpoint {instance.endpoint!r}: instance {instance.id} is stopped")
        spec = self._specs.get(instance.endpoint)
        wake_s = (spec.wake_s or spec.cold_start_s) if spec else 0.0
        level = self._sleeping.get(instance.id, instance.sleep_level)
        if spec is not None and level == 2 and spec.wake_level2_s is not None:
            wake_s = spec.wake_level2_s
        self._wait(self.duration_s(instance, wake_s) * instance.time_scale)
        self._sleeping.pop(instance.id, None)

    def is_sleeping(self, instance: Instance) -> bool:
        return instance.id in self._sleeping
