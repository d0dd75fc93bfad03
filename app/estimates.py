"""Learned service time: what the planner assumes for a job submitted without ``service_s``.

Every execute phase of a workload function records its measured duration (workload
seconds: wall seconds ÷ ``time_scale``) in ``P:exec:{workload}:{endpoint}``, a list of
the latest :data:`WINDOW` runs, in the same fenced commit that marks the phase done
(:func:`record_ops`). The estimate of (workload, endpoint) is the median of that
window once it holds ``min_runs`` runs, and the prior until then: the workload's
``expected_s``, else ``Settings.default_service_s``. The median is the running quantile
the planner uses: it ignores a few outliers (a cold page cache, a retry) that a mean
would not.

The producer (:class:`makespan.client.Client`) reads the estimate at submit and writes it
as the job's ``service_s`` with ``service_estimated`` = 1, so the planner and the
simulator see an ordinary job; a job queued before the window filled keeps the prior
it was submitted with. Estimate error (planned vs actual execute time) is reported per
workload by :func:`makespan.run_report.estimate_errors` and the metric
``makespan_estimate_error_ratio``.
"""

from __future__ import annotations

import statistics

import redis

from makespan.errors import StoreError
from makespan.keys import Keys

WINDOW = 100  # runs kept per (workload, endpoint)


def estimate_s(r: redis.Redis, keys: Keys, workload: str, endpoint: str, prior_s: float, min_runs: int) -> tuple[float, int]:
    """The planning estimate of one run of ``workload`` on ``endpoint``.

    Returns:
        (seconds, runs measured): the median of the measured window when it holds at
        least ``min_runs`` runs, else ``prior_s``.
    Raises:
        StoreError: Redis failed."""
    try:
        raw = r.lrange(keys.exec_times(workload, endpoint), 0, WINDOW - 1)
    except redis.RedisError as e:
        raise StoreError(f"service-time estimate of {workload!r} on {endpoint!r}: {e}") from e
    runs = [float(x) for x in raw]
    if len(runs) >= min_runs:
        return max(statistics.median(runs), 1e-6), len(runs)
    return prior_s, len(runs)


def record_ops(keys: Keys, workload: str, endpoint: str, actual_s: float) -> list[tuple]:
    """Fenced ops (:meth:`makespan.workers.leases.LeaseStore.fenced`) that add one measured
    run of ``actual_s`` workload seconds to the window."""
    key = keys.exec_times(workload, endpoint)
    return [("LPUSH", key, repr(float(actual_s))), ("LTRIM", key, 0, WINDOW - 1)]
