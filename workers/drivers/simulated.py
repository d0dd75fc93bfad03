"""The simulated driver: transitions are time-scaled sleeps, no process runs.

``start`` sleeps ``cold_start_s × time_scale``; ``stop`` sleeps ``evict_s × time_scale``;
``wake`` sleeps ``wake_s × time_scale`` (``cold_start_s`` when the endpoint has no
``wake_s``). Health is "not stopped" (in this process only).
"""

from __future__ import annotations

import time

from makespan.errors import PhaseError
from makespan.models import EndpointSpec
from makespan.workers.drivers.base import Instance


class SimulatedDriver:
    name = "simulated"

    def __init__(self) -> None:
        self._specs: dict[str, EndpointSpec] = {}

    def start(self, endpoint: EndpointSpec, gpus: list[str], time_scale: float = 1.0,
              host: str = "", on_spawn=None) -> Instance:  # no process: nothing to track early
        if len(gpus) != endpoint.tensor_parallel:
            raise PhaseError(f"endpoint {endpoint.name!r}: needs {endpoint.tensor_parallel} GPUs, got {len(gpus)}")
        time.sleep(endpoint.cold_start_s * time_scale)
        self._specs[endpoint.name] = endpoint
        return Instance(endpoint.name, list(gpus), self.name, host=host, time_scale=time_scale)

    def stop(self, instance: Instance) -> None:
        if instance.stopped:
            return
        spec = self._specs.get(instance.endpoint)
        time.sleep((spec.evict_s if spec else 0.0) * instance.time_scale)
        instance.stopped = True

    def health(self, instance: Instance) -> bool:
        return not instance.stopped

    def sleep(self, instance: Instance, level: int = 1) -> None:
        spec = self._specs.get(instance.endpoint)
        time.sleep((spec.evict_s if spec else 0.0) * instance.time_scale)

    def wake(self, instance: Instance) -> None:
        spec = self._specs.get(instance.endpoint)
        wake_s = (spec.wake_s or spec.cold_start_s) if spec else 0.0
        time.sleep(wake_s * instance.time_scale)
