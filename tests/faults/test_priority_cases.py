"""Priority regression cases on one GPU, against the planner worker in-process (real
Redis; dispatch captured instead of sent to Celery, phases finished by the phase
runner's own completion step). In this design the planner dispatches a job only when
its GPU group is free, so a GPU worker never holds an unstarted job beyond its slots."""

from __future__ import annotations

import dataclasses

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.host_liveness import announce
from makespan.workers.phases import PhaseRunner
from makespan.workers.planner_worker import PlannerWorker

ONE_GPU = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                       "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 20000, "cold_start_s": 1}}})


def _setup(r, keys, settings, **kw):
    s = dataclasses.replace(settings, **kw)
    sent = []
    w = PlannerWorker(r, s, ONE_GPU, dispatch=lambda ctx, q: sent.append(ctx))
    w.token = ""
    return w, Producer(r, keys, ONE_GPU, s), PhaseRunner(r, s, ONE_GPU), sent


def _finish_running(runner, sent):
    assert runner._finish(sent[-1], "completed", "") == "completed"


def test_critical_is_at_most_second_and_no_unstarted_job_is_held(r, keys, settings):
    w, prod, runner, sent = _setup(r, keys, settings, lease_ttl_s=60.0)
    low = [prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id for _ in range(10)]
    for _ in range(5):
        w.tick()
    assert [c.job_id for c in sent] == [low[0]]  # one slot: one job dispatched, nothing held in reserve
    crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL"}).id
    w.tick()  # CRITICAL preempts the running LOW job (or waits for it: either way it is second)
    for _ in range(3):
        assert r.zcard(keys.leases) <= 1  # never more than the one slot's job dispatched
        _finish_running(runner, sent)
        w.tick()
    order = [c.job_id for c in sent]
    assert order[0] == low[0] and order[1] == crit
    assert crit not in order[2:] and set(order[2:]) <= set(low)


def test_three_critical_start_before_any_waiting_low_or_normal(r, keys, settings):
    w, prod, runner, sent = _setup(r, keys, settings, lease_ttl_s=60.0)
    rest = [prod.submit({"endpoint": "e", "service_s": 5, "priority": p}).id for p in ["LOW", "NORMAL"] * 20]
    w.tick()
    first = sent[0].job_id
    crit = [prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL"}).id for _ in range(3)]
    for _ in range(4):
        _finish_running(runner, sent)
        w.tick()
    order = [c.job_id for c in sent]
    assert order[0] == first and first in rest
    assert order[1:4] == crit  # in submission order, before any LOW or NORMAL not yet started
    assert order[4] in rest and r.hget(keys.job(order[4]), "priority") == "NORMAL"


def test_critical_whose_worker_died_is_redelivered_ahead_of_50_low(r, keys, settings):
    # a long TTL, expired by hand below: a short one (0.3 s, as first written) also expired the
    # second lease between the two ticks when a tick on a loaded machine outlasted it
    w, prod, runner, sent = _setup(r, keys, settings, lease_ttl_s=60.0)
    announce(r, keys, "h", "worker-h", 600.0)  # a worker consumes h (as a live one does)
    crit = prod.submit({"endpoint": "e", "service_s": 5, "priority": "CRITICAL"}).id
    w.tick()
    assert [c.job_id for c in sent] == [crit]
    r.hset(keys.phase(sent[0].lease_id), "evict:claimed", "1")  # its first phase started: an attempt
    low = [prod.submit({"endpoint": "e", "service_s": 5, "priority": "LOW"}).id for _ in range(50)]
    # the worker was SIGKILLed: no heartbeat, the lease expires (on the server clock)
    r.zadd(keys.leases, {sent[0].lease_id: 0})
    r.delete(keys.gpu(sent[0].gpus[0]))  # its GPU key's PX ran out too
    w.tick()  # reclaims (requeued with its original order) and leases again in the same cycle
    w.tick()
    assert [c.job_id for c in sent] == [crit, crit]
    assert r.hget(keys.job(crit), "attempts") == "1" and r.hget(keys.job(crit), "state") == "leased"
    assert all(r.hget(keys.job(j), "state") == "queued" for j in low)
