"""`makespan status` / job.status() of a job that no longer waits still carries the wait
reason and ETA the planner wrote while it was queued. (found by a review, 2026-12-04; fails on the code before its fix)"""
from __future__ import annotations

import dataclasses
import time
import uuid

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.host_liveness import announce
from makespan.workers.leases import LeaseStore
from makespan.workers.planner_worker import PlannerWorker

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def test_a_leased_job_has_no_wait_reason(r, settings):
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx))
    prod = Producer(r, w.keys, ONE, s)
    r.set(w.keys.planner_leader, w.name)
    announce(r, w.keys, "h", "worker-h", 600.0)  # a worker consumes h (else an expired lease there takes h down)
    holder = prod.submit({"endpoint": "e", "service_s": 1000, "priority": "LOW"}).id
    # a long TTL, expired by hand below: with 1 s, a first tick slower than that on a loaded
    # machine reclaimed the holder's lease before the test looked at the waiting job
    lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 60.0, job_id=holder, kind="job",
                                          holder="h", queue=w.keys.queue("LOW"),
                                          info={"planned_end_s": repr(w.now_s() + 1000), "endpoint": "e",
                                                "priority": "LOW"})
    assert lease is not None
    jid = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id
    w.tick()
    assert prod.status(jid)["wait_reason"] == "waiting_for_gpus" and sent == []
    # the holder's lease expires (on the server clock; its GPU key's PX with it): reclaimed
    # (no phase claimed: requeued), the GPU frees
    r.zadd(w.keys.leases, {lease.lease_id: 0})
    r.delete(w.keys.gpu("GPU-h-0"))
    w.tick()
    if not sent:
        w.tick()
    assert [c.job_id for c in sent] == [jid]
    st = prod.status(jid)
    assert st["state"] == "leased"
    assert "wait_reason" not in st and "wait_eta" not in st, st


def test_status_of_a_job_the_planner_no_longer_reads_is_behind_the_batch(r, settings):
    """A LOW job read by one tick (waiting_for_gpus, an ETA) is left unread once a NORMAL
    job fills the batch of one: `makespan why` says behind_batch with no ETA, but
    status()/`makespan status` still gave the old tick's reason and ETA (an ETA that
    passes and stays; docs/concepts.md: status carries the same fields as why). The
    dashboard's queue did the same (docs/dashboard.md: the same answer as why)."""
    from makespan.cli_why import explain
    from makespan.dashboard.state import snapshot
    from makespan.workers.batch import REASON_REFRESH_S
    from makespan.workers.tick.clock import ManualClock

    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", batch_size=1, critical_lane=False)
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: None, clock=clock)
    try:
        prod = Producer(r, w.keys, ONE, s)
        r.set(w.keys.planner_leader, w.name)  # as a leading planner holds it (ticked by hand here)
        holder = prod.submit({"endpoint": "e", "service_s": 1000, "priority": "NORMAL"}).id
        assert LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 60.0, job_id=holder, kind="job",
                                             holder="h", queue=w.keys.queue("NORMAL"),
                                             info={"planned_end_s": repr(w.now_s() + 1000), "endpoint": "e",
                                                   "priority": "NORMAL"}) is not None
        low = prod.submit({"endpoint": "e", "service_s": 100, "priority": "LOW"}).id
        w.tick()
        st = prod.status(low)
        assert st["wait_reason"] == "waiting_for_gpus" and st["wait_eta"] is not None
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
        clock.advance(REASON_REFRESH_S + 0.2)
        w.tick()  # the batch of one holds the NORMAL job: the LOW queue is not read
        why = explain(r, w.keys, s, low)
        assert (why["reason"], why["eta"]) == ("behind_batch", None), why
        st = prod.status(low)
        assert (st["wait_reason"], st["wait_detail"], st["wait_eta"]) == (why["reason"], why["detail"], None), st
        [row] = [row for row in snapshot(r, w.keys)["queue"] if row["job"] == low]  # the dashboard's queue too
        assert row["reason_code"] == "behind_batch" and row["eta"] is None, row
    finally:
        w.close()


def test_the_job_page_gives_the_reason_status_gives(r, settings):
    """The dashboard's job page showed a queued job's stale planner reason while no planner
    led, and no reason for a delayed job (review): it reads them as `makespan status` does."""
    from makespan.dashboard.state import job_detail

    s = dataclasses.replace(settings, lease_ttl_s=60.0)
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: None)
    prod = Producer(r, w.keys, ONE, s)
    queued = prod.submit({"endpoint": "e", "service_s": 10, "priority": "NORMAL"}).id
    sec, _usec = r.time()
    r.hset(w.keys.job(queued), mapping={"wait_reason": "waiting_for_gpus", "wait_detail": "old planner text",
                                        "wait_eta": "", "wait_at": repr(sec - 600.0)})
    later = prod.submit({"endpoint": "e", "service_s": 10, "priority": "NORMAL", "delay_s": 300}).id
    for job in (queued, later):
        page = job_detail(r, w.keys, job, stale_after_s=30.0)["record"]
        status = prod.status(job)
        assert (page["wait_reason"], page["wait_detail"], page["wait_eta"]) == \
            (status["wait_reason"], status["wait_detail"], status["wait_eta"])
    assert prod.status(queued)["wait_reason"] == "no_planner" and prod.status(later)["wait_reason"] == "delayed_until"
