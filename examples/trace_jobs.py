"""The stand-in for a job of a real trace: it holds its leased GPUs for its service time.

The demo and ``makespan replay`` submit trace rows as calls of ``trace_job`` with the
row's duration; the function sleeps it (scaled by the worker's time scale) and stops at
once when the job is cancelled or loses its lease.
"""

from __future__ import annotations

from typing import Any

import makespan


@makespan.workload(name="trace_job")
def trace_job(ctx: makespan.WorkloadContext, service_s: float, row: Any = None) -> dict[str, Any]:
    """Hold the GPUs for ``service_s`` workload seconds; returns what ran where."""
    ctx.cancelled.wait(service_s * ctx.time_scale)
    return {"row": row, "gpus": ctx.gpus, "host": ctx.host}
