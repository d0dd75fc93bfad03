"""Endpoint drivers: ``simulated``, ``process`` and ``vllm`` behind one interface
(:class:`makespan.workers.drivers.base.EndpointDriver`)."""

from __future__ import annotations

from typing import Any

from makespan.errors import ValidationError
from makespan.workers.drivers.base import EndpointDriver, Instance

DRIVERS = ("simulated", "process", "vllm")


def get_driver(name: str, **options: Any) -> EndpointDriver:
    """A driver by name; ``options`` go to its constructor (process/vllm: ``grace_s``,
    ``log_dir``, ``health_timeout_s``, backoff bounds; simulated: ``endpoints``,
    ``slowdown``).

    Raises:
        ValidationError: unknown driver name.
    """
    if name == "simulated":
        from makespan.workers.drivers.simulated import SimulatedDriver

        return SimulatedDriver(**options)
    if name == "process":
        from makespan.workers.drivers.process import ProcessDriver

        return ProcessDriver(**options)
    if name == "vllm":
        from makespan.workers.drivers.vllm import VllmDriver

        return VllmDriver(**options)
    raise ValidationError("launch.driver", name, f"unknown driver; use one of {', '.join(DRIVERS)}")


__all__ = ["DRIVERS", "EndpointDriver", "Instance", "get_driver"]
