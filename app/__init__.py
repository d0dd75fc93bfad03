"""makespan: schedules multi-step GPU workloads on a fleet of GPU hosts.

Producers call :func:`makespan.producer.submit`; the planner worker (``makespan planner``)
plans batches and publishes GPU leases; GPU workers (``makespan gpu-worker``) run the
phase tasks. See ``docs/`` and ``../shared/design.md`` for the words used here.
"""

__version__ = "0.1.0"
