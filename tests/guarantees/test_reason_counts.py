"""Prometheus counts queued jobs by wait reason (issue 19 point 5), bounded labels: the
live planner's reason write replaces ``P:planner:reasons`` with per-reason counts, and
:class:`makespan.metrics.RedisStateCollector` exports ``makespan_queued_jobs_by_reason``
with every code of :data:`makespan.wait_reasons.REASONS` (0 when none). In-process planner
ticks on a real Redis; the collector scraped through prometheus-client."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest

from makespan.metrics import RedisStateCollector
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.wait_reasons import QUEUED_REASONS as REASONS
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def _scrape(r, keys) -> dict[str, float]:
    reg = CollectorRegistry()
    reg.register(RedisStateCollector(r, keys))
    out = {}
    for line in generate_latest(reg).decode().splitlines():
        if line.startswith("makespan_queued_jobs_by_reason{"):
            label = line.split('reason="', 1)[1].split('"', 1)[0]
            out[label] = float(line.split()[-1])
    return out


def test_queued_jobs_by_reason_counted_and_cleared(r, settings):
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx))
    try:
        prod = Producer(r, w.keys, ONE, s)
        assert _scrape(r, w.keys) == {code: 0.0 for code in REASONS}  # before any tick: every code at 0
        first = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id
        waiting = [prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id for _ in range(2)]
        dep = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL", "depends_on": [first]}).id
        w.tick()
        assert [c.job_id for c in sent] == [first]
        assert r.hgetall(w.keys.wait_reason_counts) == {"waiting_for_gpus": "2", "waiting_for_dependency": "1"}
        got = _scrape(r, w.keys)
        assert set(got) == set(REASONS)  # bounded: the fixed codes, nothing else
        assert got["waiting_for_gpus"] == 2.0 and got["waiting_for_dependency"] == 1.0
        assert sum(got.values()) == 3.0
        # the first job ends, the rest are cancelled: the next tick finds nothing queued
        assert PhaseRunner(r, s, ONE)._finish(sent[0], "completed", "") == "completed"
        for jid in waiting + [dep]:
            prod.cancel(jid)
        w.tick()
        assert r.exists(w.keys.wait_reason_counts) == 0
        assert _scrape(r, w.keys) == {code: 0.0 for code in REASONS}
    finally:
        w.close()


def test_a_full_fleet_recounts_when_queued_jobs_leave(r, settings):
    """Every GPU held, two jobs waiting: cancelling one used to leave the counts (and the
    other's ETA, planned behind it) as the last batch wrote them until a GPU freed, since no
    new job headed a queue; cancelling both left ``waiting_for_gpus 2`` with nothing queued.
    A job gone from the queue heads now forms a batch too (at most once per
    REASON_REFRESH_S): the count drops, the ETA moves up, the counts clear."""
    import time

    from makespan.workers.batch import REASON_REFRESH_S
    from makespan.workers.tick.clock import ManualClock

    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", critical_lane=False)
    clock = ManualClock(time.time())
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    try:
        prod = Producer(r, w.keys, ONE, s)
        prod.submit({"endpoint": "e", "service_s": 1000, "priority": "NORMAL"})
        w.tick()
        assert len(sent) == 1  # the GPU is held from now on
        ahead = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id
        behind = prod.submit({"endpoint": "e", "service_s": 100, "priority": "LOW"}).id
        clock.advance(REASON_REFRESH_S)
        w.tick()
        assert r.hgetall(w.keys.wait_reason_counts) == {"waiting_for_gpus": "2"}
        eta_before = float(r.hget(w.keys.job(behind), "wait_eta"))
        prod.cancel(ahead)
        clock.advance(REASON_REFRESH_S)
        w.tick()
        assert r.hgetall(w.keys.wait_reason_counts) == {"waiting_for_gpus": "1"}
        # no longer planned behind the cancelled job's 100 s (+ its start): 1 wall s at time_scale 0.01
        assert float(r.hget(w.keys.job(behind), "wait_eta")) < eta_before - 0.5
        prod.cancel(behind)
        clock.advance(REASON_REFRESH_S)
        w.tick()
        assert r.exists(w.keys.wait_reason_counts) == 0
        assert _scrape(r, w.keys) == {code: 0.0 for code in REASONS}
        assert len(sent) == 1
    finally:
        w.close()


def test_a_job_the_tick_leased_is_no_cause_to_plan_again(r, settings):
    """The tick that leased a job wrote the other jobs' reasons with it started: that job
    leaving the queue heads forms no batch for the reasons a second later (a full fleet
    plans again only when its queue heads changed otherwise)."""
    import time

    from makespan.workers.batch import REASON_REFRESH_S
    from makespan.workers.tick.clock import ManualClock

    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", critical_lane=False)
    clock = ManualClock(time.time())
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    try:
        prod = Producer(r, w.keys, ONE, s)
        jobs = {prod.submit({"endpoint": "e", "service_s": 100 * n, "priority": "NORMAL"}).id for n in (1, 10)}
        w.tick()
        [waiting] = jobs - {c.job_id for c in sent}
        assert len(sent) == 1 and r.hget(w.keys.job(waiting), "wait_reason") == "waiting_for_gpus"
        written = r.get(w.keys.wait_reasons_at)
        clock.advance(REASON_REFRESH_S)
        time.sleep(0.002)  # the reason write's time is the server's, in ms
        w.tick()
        assert r.get(w.keys.wait_reasons_at) == written
    finally:
        w.close()


def test_behind_batch_no_planner_and_delayed_are_counted(r, settings):
    """The gauge said 0 for ``behind_batch`` and ``no_planner`` while `makespan jobs` showed
    jobs waiting for them (new-user check: 10 of 14 behind the batch, gauge 0): the planner
    writes counts only for the jobs its tick read. Now the rest of the queue counts as
    ``behind_batch``, every queued job as ``no_planner`` while none leads, and delayed jobs
    (not queued) in ``makespan_delayed_jobs``."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio", batch_size=2)
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx))
    try:
        prod = Producer(r, w.keys, ONE, s)
        for _ in range(6):
            prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL", "delay_s": 600})
        w.tick()
        assert len(sent) == 1
        got = _scrape(r, w.keys)
        assert got["waiting_for_gpus"] == 1.0 and got["behind_batch"] == 4.0 and sum(got.values()) == 5.0
        reg = CollectorRegistry()
        reg.register(RedisStateCollector(r, w.keys))
        assert "makespan_delayed_jobs 1.0" in generate_latest(reg).decode()
        r.set(w.keys.wait_reasons_at, "1")  # the last write is old and no planner holds the lock
        assert _scrape(r, w.keys) == {code: 5.0 if code == "no_planner" else 0.0 for code in REASONS}
    finally:
        w.close()
