"""A planner-like process for the metrics tests: serves /metrics with the Redis state
collector and records a known workload's events (argv: port), then waits."""

from __future__ import annotations

import sys
import time

from makespan import metrics

if __name__ == "__main__":
    metrics.start_metrics_server(int(sys.argv[1]), addr="127.0.0.1")
    metrics.job_preempted("LOW")
    metrics.job_failed("HIGH")
    for w in (0.02, 0.3, 4.0):
        metrics.observe_wait("HIGH", w)
    metrics.observe_solve(0.004, 6)
    metrics.observe_solve(0.2, 3)
    metrics.gpu_seconds("idle", 12.5)
    metrics.incident("coder")
    print("ready", flush=True)
    time.sleep(120)
