"""makespan_leases_reclaimed_total ("Expired leases reclaimed") counts a lease the snapshot
saw expired but that was renewed before its reclaim script ran (outcome 'live': nothing reclaimed). (found by a review, 2026-12-04; fails on the code before its fix)"""
from __future__ import annotations

import dataclasses
import logging
import types
import uuid

from makespan import metrics
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick import steps
from makespan.workers.tick.context import TickContext

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def test_a_renewed_lease_is_not_counted_reclaimed(r, settings, monkeypatch):
    monkeypatch.setattr(metrics, "_metrics", metrics.Metrics())
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: None)
    jid = Producer(r, w.keys, ONE, s).submit({"endpoint": "e", "service_s": 100, "priority": "LOW"}).id
    lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 60.0, job_id=jid, kind="job", holder="h",
                                          queue=w.keys.queue("LOW"),
                                          info={"planned_end_s": "0", "endpoint": "e", "priority": "LOW"})
    # the snapshot saw it expired; its holder renewed it before the reclaim script ran
    monkeypatch.setattr(steps, "read_snapshot", lambda env, kept: None)
    ctx = TickContext(w.env, w.kept, "", snapshot=types.SimpleNamespace(expired_leases=(lease.lease_id,)))
    steps.ReclaimExpired().run(ctx)
    assert r.hget(w.keys.job(jid), "state") == "leased"  # nothing was reclaimed
    assert metrics._m().reclaimed.labels("lease_expired")._value.get() == 0.0
    assert ctx.reclaimed == 0


def test_the_reclaim_log_line_names_the_jobs(r, settings, monkeypatch, caplog):
    """An operator reading the planner log learns which job an expired lease held, not only a count."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", retry_backoff_s=0.0)
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: None)
    jid = Producer(r, w.keys, ONE, s).submit({"endpoint": "e", "service_s": 100, "priority": "LOW"}).id
    lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 60.0, job_id=jid, kind="job", holder="h",
                                          queue=w.keys.queue("LOW"),
                                          info={"planned_end_s": "0", "endpoint": "e", "priority": "LOW"})
    r.zadd(w.keys.leases, {lease.lease_id: 0})  # expired on the server clock
    monkeypatch.setattr(steps, "read_snapshot", lambda env, kept: None)
    ctx = TickContext(w.env, w.kept, "", snapshot=types.SimpleNamespace(expired_leases=(lease.lease_id,)))
    with caplog.at_level(logging.WARNING, logger="makespan.planner"):
        steps.ReclaimExpired().run(ctx)
    assert r.hget(w.keys.job(jid), "state") == "queued"
    assert f"reclaimed expired leases: {{'requeued': 1}}; jobs requeued: {jid}" in caplog.text
