"""``makespan simulate``: read a fleet file and a trace, run the simulator, write the report.

The file reading lives here, in the application, because the planner
(:mod:`makespan.planner.simulator`) imports nothing of the application's models or
trace readers (pyproject's ``[tool.importlinter]`` layers).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from makespan.errors import ValidationError
from makespan.models import load_fleet
from makespan.planner.policies import POLICY_REGISTRY
from makespan.planner.simulator import simulate, writable_report_path, write_report
from makespan.traces import read_trace


def run_simulation(trace_path: str | Path, fleet_path: str | Path, policy: str, seed: int = 0, start: int = 0,
                   limit: int | None = None, report_path: str | Path | None = None,
                   time_scale: float = 1.0, window_s: float = 30.0, preemption: bool | str = True,
                   restore: bool = True, time_limit_s: float | None = None,
                   progress: Callable[[dict[str, Any]], None] | None = None,
                   set_point_weight: float = 0.0, prewarm: bool = False) -> dict[str, Any]:
    """``makespan simulate``: read the fleet (TOML) and the trace (ITP, Alibaba or JSON
    lines; rows ``start`` … ``start+limit`` mapped with ``seed``), simulate, and write
    the report JSON to ``report_path`` when given (checked writable before the run, so a
    long run is not lost to a bad path). ``time_scale`` divides submission and service
    times; ``preemption``/``restore``/``time_limit_s``/``progress``/``set_point_weight``/``prewarm``: as
    :func:`makespan.planner.simulator.simulate`.
    Returns the report.

    Raises:
        makespan.errors.ValidationError: bad fleet or trace file, no rows in the asked range,
            ``time_scale`` or ``time_limit_s`` not positive, ``set_point_weight`` negative
            or not finite, or a report path that cannot be written.
        makespan.errors.PlannerError: unknown policy.
    """
    if not time_scale > 0:
        raise ValidationError("time_scale", time_scale, "must be > 0")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValidationError("time_limit_s", time_limit_s, "must be > 0")
    if not 0 <= set_point_weight < float("inf"):
        raise ValidationError("set_point_weight", set_point_weight, "must be a finite number >= 0")
    POLICY_REGISTRY.lookup(policy)  # an unknown name fails before the files are read
    fleet = load_fleet(fleet_path)
    jobs = read_trace(trace_path, fleet, seed=seed, start=start, limit=limit)
    if not jobs:
        raise ValidationError("trace", str(trace_path), f"no rows from row {start} on (the trace is shorter)")
    out = writable_report_path(report_path) if report_path is not None else None
    rep = simulate(jobs, fleet, policy, seed, time_scale=time_scale, window_s=window_s, preemption=preemption,
                   restore=restore, time_limit_s=time_limit_s, progress=progress, set_point_weight=set_point_weight,
                   prewarm=prewarm)
    if out is not None:
        write_report(out, rep)
    return rep
