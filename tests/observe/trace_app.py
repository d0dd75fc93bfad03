"""A Celery app for the tracing tests: one task runs every phase span of a job.

Started by the tests as a real worker (``celery -A trace_app worker``) with
``PYTHONPATH`` pointing here; broker and key prefix come from the environment.
"""

from __future__ import annotations

import os

from celery import Celery

from makespan.telemetry import child_span, end_job_span, instrument_celery, phase_span

app = Celery("trace-test", broker=os.environ.get("TRACE_TEST_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    broker_transport_options={"global_keyprefix": os.environ.get("TRACE_TEST_PREFIX", "mst-trace") + ":celery:"},
    task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True,
    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
)
instrument_celery(app, "test-gpu-worker")


@app.task(name="trace_test.phases")
def phases(traceparent: str, submit_ts: float, job_id: str) -> None:
    attrs = {"job_id": job_id, "priority": "HIGH", "endpoint": "coder", "gpus": ["GPU-a-0", "GPU-a-1"],
             "planned_s": 1.0}
    for phase in ("evict", "start_endpoint", "execute", "clear", "restore"):
        with phase_span(phase, traceparent, attrs):
            if phase == "start_endpoint":
                with child_span("process_spawn", {"endpoint": "coder"}):
                    pass
                with child_span("health_check", {"endpoint": "coder"}):
                    pass
    end_job_span(traceparent, submit_ts, {"job_id": job_id, "priority": "HIGH"})
