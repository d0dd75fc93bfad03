"""A lease release wakes the planner to plan at once; a submit lets a small batch wait
``batch_wait_s`` for more arrivals (workers/planner_worker.py ``_wait_for_work``; real Redis,
in-process planner and phase runner)."""

from __future__ import annotations

import dataclasses

from makespan.keys import WAKE_RELEASE
from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 10000, "cold_start_s": 1}}})


def _worker(r, settings):
    s = dataclasses.replace(settings, batch_wait_s=5.0, batch_size=256, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx))
    waits: list[float | None] = []
    w._stop.wait = lambda timeout=None: waits.append(timeout)  # the batch wait, recorded instead of slept
    return w, sent, waits


def test_a_submit_wake_waits_for_more_arrivals_a_release_wake_does_not(r, settings):
    w, sent, waits = _worker(r, settings)
    prod = Producer(r, w.keys, ONE, w.settings)
    first = prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"}).id  # pushes "1"
    w._wait_for_work()
    assert waits == [5.0]  # a small batch waits for more arrivals
    w.tick()
    assert [c.job_id for c in sent] == [first]
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w._wait_for_work()
    assert waits == [5.0, 5.0]
    # the first job ends: its GPU worker's release pushes WAKE_RELEASE after the submit's "1"
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    assert PhaseRunner(r, w.settings, ONE)._finish(sent[0], "completed", "") == "completed"
    assert r.lrange(w.keys.planner_wake, 0, -1) == ["1", WAKE_RELEASE]
    w._wait_for_work()
    assert waits == [5.0, 5.0]  # planned at once: the freed GPU does not idle for batch_wait_s
    assert not r.exists(w.keys.planner_wake)  # the coming tick covers every wake-up so far
