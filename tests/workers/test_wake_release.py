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
    w._batch_wait = lambda wait_s: waits.append(wait_s)  # the batch wait, recorded instead of waited
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
    # the first job ends: its GPU worker's release goes at the head, before the submit's "1",
    # and a burst of submits behind it does not trim it (the list keeps its first 16)
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    assert PhaseRunner(r, w.settings, ONE)._finish(sent[0], "completed", "") == "completed"
    for _ in range(20):
        prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    assert r.lrange(w.keys.planner_wake, 0, -1) == [WAKE_RELEASE] + ["1"] * 15
    w._wait_for_work()
    assert waits == [5.0, 5.0]  # planned at once: the freed GPU does not idle for batch_wait_s
    assert not r.exists(w.keys.planner_wake)  # the coming tick covers every wake-up so far


def test_a_release_during_the_batch_wait_ends_it(r, settings):
    """A submit wakes the planner and it waits up to batch_wait_s for more arrivals; a lease
    released meanwhile ends the wait (the freed GPU must not idle for the rest of it)."""
    import threading
    import time

    s = dataclasses.replace(settings, batch_wait_s=30.0, batch_size=256, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, ONE, dispatch=lambda ctx, q: sent.append(ctx))
    prod = Producer(r, w.keys, ONE, w.settings)
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    w.tick()
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})
    ended = threading.Event()
    waiter = threading.Thread(target=lambda: (w._wait_for_work(), ended.set()), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 10.0
    while r.exists(w.keys.planner_wake) and time.monotonic() < deadline:  # the waiter took the submit's wake-up
        ended.wait(0.01)
    prod.submit({"endpoint": "e", "service_s": 100, "priority": "NORMAL"})  # a submit does not end the wait
    assert not ended.wait(0.3)
    assert PhaseRunner(r, w.settings, ONE)._finish(sent[0], "completed", "") == "completed"
    assert ended.wait(10.0), "the release did not end the 30 s batch wait"
    waiter.join(5.0)
    assert not r.exists(w.keys.planner_wake)
