"""A real Celery worker for the metrics tests: the parent serves /metrics, tasks run in
pool processes and record event metrics (argv: port pool queue)."""

from __future__ import annotations

import os
import sys

from celery import Celery

from makespan import metrics

app = Celery("metrics-test", broker=os.environ.get("TRACE_TEST_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    broker_transport_options={"global_keyprefix": os.environ.get("TRACE_TEST_PREFIX", "mst-m") + ":celery:"},
    task_serializer="json", accept_content=["json"], task_ignore_result=True, worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True, worker_prefetch_multiplier=1,
)


@app.task(name="metrics_test.job")
def job(priority: str, execute_s: float, gpus: int) -> int:
    metrics.phase("evict", 0.25, gpus)
    metrics.transition("evict", 0.25)
    metrics.phase("execute", execute_s, gpus)
    metrics.job_completed(priority)
    metrics.observe_wait(priority, 1.5)
    return os.getpid()


if __name__ == "__main__":
    port, pool, queue = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    metrics.start_metrics_server(port, redis_state=False, addr="127.0.0.1")
    app.worker_main(["worker", "-P", pool, "-c", "2", "-Q", queue, "--without-heartbeat", "--without-mingle",
                     "--without-gossip", "-l", "WARNING"])
