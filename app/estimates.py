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

Learned transition durations (issue 20), the same pattern: every executed transition
(kind ``evict``, ``sleep``, ``wake``, ``wake_level2``, ``cold_start``, ``restore``: a
restore's cold load) records its measured duration in workload seconds in ``P:transition:{endpoint}:{host}:
{kind}`` (:func:`transition_record_ops`, in the phase's fenced commit), a list of the
latest :data:`TRANSITION_WINDOW`. The planned duration of one kind of an endpoint on a
host (:func:`transition_estimate`) is a high quantile (``Settings.transition_quantile``,
p90 by default: a transition planned too short delays everything after it) of that
host's window once it holds ``min_observations``; else of the other hosts' windows
together once they do (a host never observed is planned like the others); else the
fleet file's figure (the prior). ``cold_start`` and ``restore`` are the same load and
pool their windows. ``wake`` is a wake from the endpoint's configured ``sleep_level`` (its
``wake_s``); ``wake_level2`` a wake from level 2 of an endpoint whose ``sleep_level`` is 1
(the plan chose level 2: its ``wake_level2_s``, vLLM reloading the dropped weights): the
two take very different times and do not share a window (:func:`wake_kind`). The live planner's :class:`makespan.planner.model.EndpointModel` has
one figure per endpoint, not per host: it takes the estimate over every host's window
together (:func:`makespan.workers.fleet_view.learned_endpoint_models`); the GPU worker
plans each transition (its agenda entry, hence the observer's overrun rule, and its
``planned_s``) with its own host's estimate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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


# -- learned transition durations (issue 20) ------------------------------------------------
TRANSITION_KINDS = ("evict", "sleep", "wake", "wake_level2", "cold_start", "restore")
TRANSITION_WINDOW = 50  # measured transitions kept per (endpoint, host, kind)
_POOLED = {"cold_start": ("cold_start", "restore"), "restore": ("restore", "cold_start")}


@dataclass(frozen=True)
class TransitionEstimate:
    """The planned duration of one transition kind.

    Attributes:
        seconds: workload seconds to plan.
        source: ``"learned"`` (this host's window; the planner's: every host's),
            ``"others"`` (the other hosts' windows) or ``"prior"`` (the fleet file).
        observations: measured transitions in the window the figure came from (the
            prior: those measured so far, fewer than the minimum).
        last_s: the latest measured duration on this host (None: none)."""

    seconds: float
    source: str
    observations: int
    last_s: float | None = None


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), ``q`` in [0, 1]; ``values`` non-empty."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def prior_s(spec, kind: str) -> float:
    """The fleet file's figure for ``kind`` of endpoint ``spec`` (an EndpointSpec or
    EndpointModel): evict and sleep ``evict_s``; wake ``wake_s`` (its cold start without
    one); wake_level2 ``wake_level2_s`` (the wake's figure without one); cold_start and
    restore ``cold_start_s``."""
    if kind in ("evict", "sleep"):
        return float(spec.evict_s)
    if kind == "wake_level2" and getattr(spec, "wake_level2_s", None) is not None:
        return float(spec.wake_level2_s)
    if kind == "wake_level2":
        kind = "wake"
    if kind == "wake":
        return float(spec.wake_s if spec.wake_s is not None else spec.cold_start_s)
    return float(spec.cold_start_s)


def wake_kind(spec, level: int | None) -> str:
    """The learned-duration kind of waking an instance of endpoint ``spec`` (an
    EndpointSpec) that sleeps at ``level`` (1 or 2; None: not recorded, its configured
    level): ``wake_level2`` for a level-2 sleeper of an endpoint whose configured
    ``sleep_level`` is 1 (planned at ``wake_level2_s``), else ``wake``."""
    return "wake_level2" if level == 2 and spec.sleep_level == 1 else "wake"


def transition_record_ops(keys: Keys, endpoint: str, host: str, kind: str, actual_s: float) -> list[tuple]:
    """Fenced ops (:meth:`makespan.workers.leases.LeaseStore.fenced`) that add one measured
    ``kind`` transition of ``actual_s`` workload seconds to its window."""
    key = keys.transition_times(endpoint, host, kind)
    return [("LPUSH", key, repr(max(float(actual_s), 0.0))), ("LTRIM", key, 0, TRANSITION_WINDOW - 1)]


Windows = Mapping[tuple[str, str, str], list[float]]  # (endpoint, host, kind) -> newest first


def read_transition_windows(r: redis.Redis, keys: Keys, endpoints: Iterable[str],
                            hosts: Iterable[str]) -> dict[tuple[str, str, str], list[float]]:
    """Every window of ``endpoints`` × ``hosts`` × :data:`TRANSITION_KINDS` in one round
    trip (empty ones left out). Raises StoreError: Redis failed."""
    combos = [(e, h, k) for e in endpoints for h in hosts for k in TRANSITION_KINDS]
    try:
        p = r.pipeline(transaction=False)
        for e, h, k in combos:
            p.lrange(keys.transition_times(e, h, k), 0, TRANSITION_WINDOW - 1)
        got = p.execute()
    except redis.RedisError as e:
        raise StoreError(f"transition durations: {e}") from e
    return {c: [float(x) for x in v] for c, v in zip(combos, got) if v}


def transition_estimate(windows: Windows, endpoint: str, host: str | None, kind: str, prior: float,
                        min_observations: int, q: float) -> TransitionEstimate:
    """The planned duration of ``kind`` for ``endpoint`` on ``host`` (None: over every
    host, the planner's figure), by the rule of the module doc."""
    kinds = _POOLED.get(kind, (kind,))
    own: list[float] = []
    others: list[float] = []
    for (e, h, k), v in windows.items():
        if e != endpoint or k not in kinds:
            continue
        (own if host is None or h == host else others).extend(v)
    mine = windows.get((endpoint, host, kind), []) if host is not None else []
    last = mine[0] if mine else None
    if len(own) >= min_observations:
        return TransitionEstimate(quantile(own, q), "learned", len(own), last)
    if host is not None and len(others) >= min_observations:
        return TransitionEstimate(quantile(others, q), "others", len(others), last)
    return TransitionEstimate(prior, "prior", len(own), last)
