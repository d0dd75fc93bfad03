"""Endpoint drivers behind one interface (:class:`makespan.workers.drivers.base.EndpointDriver`):
the built-in ``simulated``, ``process`` and ``vllm``, and any a package adds through the
``makespan.drivers`` entry-point group (:mod:`makespan.driver_registry`)."""

from __future__ import annotations

from typing import Any

from makespan.driver_registry import DRIVERS, DriverCapabilities, DriverContext
from makespan.workers.drivers.base import EndpointDriver, Instance
from makespan.workers.drivers.pids import process_alive


def get_driver(name: str, context: DriverContext | None = None, **options: Any) -> EndpointDriver:
    """A new driver ``name`` (:meth:`makespan.driver_registry.DriverRegistry.create`);
    ``options`` go to its constructor (process/vllm: ``grace_s``, ``log_dir``,
    ``health_timeout_s``, backoff bounds, ``probe_timeout_s``; simulated: ``endpoints``, ``slowdown``).

    Raises:
        ValidationError: unknown driver name (field ``launch.driver``; the reason lists
            the known drivers), or an option the driver does not take.
    """
    return DRIVERS.create(name, context=context, **options)


def capabilities(name: str) -> DriverCapabilities:
    """What driver ``name`` can do. Raises ValidationError: unknown driver name."""
    return DRIVERS.capabilities(name)


__all__ = ["DRIVERS", "DriverCapabilities", "DriverContext", "EndpointDriver", "Instance", "capabilities",
           "get_driver", "process_alive"]
