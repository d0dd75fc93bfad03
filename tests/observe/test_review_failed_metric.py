"""makespan_jobs_failed_total{priority}: "Jobs that failed for good" (docs/metrics.md:
job_failed, called by the GPU worker / planner). (found by a review, 2026-12-04; fails on the code before its fix)"""
from __future__ import annotations

import dataclasses
import time
import uuid
from types import SimpleNamespace

from makespan import metrics
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseRunner, PhaseContext
from makespan.workers.planner_worker import PlannerWorker

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def _failed(prio):
    return metrics._m().failed.labels(prio)._value.get()


def test_a_cancelled_job_is_not_counted_failed(monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    ctx = PhaseContext("lease1", 1, ["g0"], "h", "job", "e", "job1", "HIGH", 10.0)
    runner = SimpleNamespace(_workload_name=lambda ctx: None)  # only what _finished reads of its runner
    PhaseRunner._finished(runner, ctx, "cancelled", "cancelled by user", time.time())
    assert _failed("HIGH") == 0.0


def test_a_job_the_planner_fails_after_max_reclaims_is_counted(r, settings, monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", max_attempts=1, retry_backoff_s=0.0)
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: None)
    prod = Producer(r, w.keys, ONE, s)
    jid = prod.submit({"endpoint": "e", "service_s": 100, "priority": "HIGH"}).id
    lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 0.05, job_id=jid, kind="job", holder="h",
                                          queue=w.keys.queue("HIGH"),
                                          info={"planned_end_s": repr(w.now_s() + 100), "endpoint": "e",
                                                "priority": "HIGH"})
    assert lease is not None
    r.hset(w.keys.phase(lease.lease_id), "evict:claimed", "1")  # a phase started: an attempt
    time.sleep(0.3)
    r.set(w.keys.planner_leader, w.name)
    w.tick()
    assert r.hget(w.keys.job(jid), "state") == "failed"
    assert _failed("HIGH") == 1.0
