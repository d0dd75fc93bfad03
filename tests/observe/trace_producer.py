"""Producer side of the tracing test: submit (choose the makespan span), allocate, publish."""

from __future__ import annotations

import sys
import time

from makespan.telemetry import instrument_producer, job_traceparent, phase_span, shutdown_tracing, use_traceparent

if __name__ == "__main__":
    assert instrument_producer("test-planner")
    from trace_app import phases

    submit_ts = time.time()
    tp = job_traceparent()
    with phase_span("allocate_gpus", tp, {"job_id": sys.argv[1], "gpus": ["GPU-a-0", "GPU-a-1"]}):
        pass
    with use_traceparent(tp):
        phases.apply_async(args=[tp, submit_ts, sys.argv[1]], queue=sys.argv[2])
    shutdown_tracing()
    print(tp)
