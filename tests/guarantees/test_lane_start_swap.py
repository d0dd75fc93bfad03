"""A tick must not lease a lower-level job that the fast lane's rule preempts at the next
tick for a HIGH job of the same batch.

A pools operator (a helper) submitted 40 mixed jobs to an idle pool of two hosts of two
GPUs: a tick leased NORMAL jobs, and 10–40 ms later the next tick's rule preempted them for
HIGH jobs that had waited all along: a run thrown away, and a preemption of the victim's
budget spent, each time (one NORMAL job ran three times). The rule now runs on the tick's
own starts before they are leased (``workers/starts.py`` ``_lane_swaps``): the HIGH job
takes the group, the NORMAL job stays queued. In-process planner on a real Redis, the
planner's own clock; the batches are seeded (5 of these seeds churned before the change)."""

from __future__ import annotations

import dataclasses
import json
import random
import time

import pytest

from makespan.models import parse_fleet
from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock

FLEET = parse_fleet({"name": "b", "hosts": [{"name": "b1", "gpu_count": 2, "memory_mib": 81920},
                                            {"name": "b2", "gpu_count": 2, "memory_mib": 81920}],
                     "endpoints": {"onlyb": {"model": "m1", "memory_mib_per_gpu": 20000, "cold_start_s": 2},
                                   "bigb": {"model": "m2", "memory_mib_per_gpu": 20000, "cold_start_s": 3,
                                            "tensor_parallel": 2}}})


@pytest.mark.parametrize("seed", [2, 9, 11, 12, 17])
def test_no_job_leased_by_one_tick_is_preempted_by_the_next(r, settings, seed):
    clock = ManualClock(time.time())
    s = dataclasses.replace(settings, time_scale=0.2, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, FLEET, s)
    rng = random.Random(seed)
    try:
        for _ in range(40):
            prod.submit({"endpoint": rng.choice(["onlyb", "bigb"]), "service_s": rng.uniform(5, 30),
                         "priority": rng.choice(["HIGH", "NORMAL", "NORMAL", "LOW"])})
        w.tick()
        first = {ctx.job_id for ctx in sent}
        clock.advance(0.02)
        w.tick()
        clock.advance(0.02)
        w.tick()
        events = [json.loads(fields["e"]) for _id, fields in r.xrange(w.keys.events)]
        churned = [e["job"] for e in events if e["kind"] == "preempted" and e["job"] in first]
        assert churned == [], churned
        held = sum(1 for host in FLEET.hosts for gpu in host.gpus if r.exists(w.keys.gpu(gpu.uuid)))
        assert held == 4  # the GPUs a swap left free are leased again by the next tick
    finally:
        w.close()


def test_a_start_on_half_of_a_gangs_group_is_left_queued_and_the_gang_preempts_the_other_half(r, settings):
    """A verifier: a HIGH TP-2 job's group held one GPU running a NORMAL job from an earlier
    tick, and the tick started another NORMAL job on the other GPU; the next tick preempted
    both. Now the start is left queued, and the same tick preempts the running job only."""
    import uuid

    from makespan.workers.leases import LeaseStore

    fleet = parse_fleet({"name": "pair", "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920}],
                         "endpoints": {"small": {"model": "m1", "memory_mib_per_gpu": 20000, "cold_start_s": 2},
                                       "big": {"model": "m2", "memory_mib_per_gpu": 20000, "cold_start_s": 2,
                                               "tensor_parallel": 2}}})
    clock = ManualClock(time.time())
    s = dataclasses.replace(settings, time_scale=0.01, lease_ttl_s=60.0, policy="portfolio")
    sent = []
    w = PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    prod = Producer(r, w.keys, fleet, s)
    try:
        old = prod.submit({"endpoint": "small", "service_s": 1000, "priority": "NORMAL"}).id
        lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, ("GPU-h-0",), 60.0, job_id=old, kind="job", holder="h",
                                              queue=w.keys.queue("NORMAL"),
                                              info={"planned_end_s": repr(w.now_s() + 1000), "endpoint": "small",
                                                    "priority": "NORMAL"})
        assert lease is not None
        gang = prod.submit({"endpoint": "big", "service_s": 10, "priority": "HIGH"}).id
        starter = prod.submit({"endpoint": "small", "service_s": 5, "priority": "NORMAL"}).id
        clock.advance(120.0)  # the gang has waited past its lane bound (30 s grace)
        w.tick()
        events = [json.loads(fields["e"]) for _id, fields in r.xrange(w.keys.events)]
        preempted = [e["job"] for e in events if e["kind"] == "preempted"]
        assert preempted == [old], preempted
        assert [ctx.job_id for ctx in sent] == [gang]
        assert r.hget(w.keys.job(starter), "state") == "queued"
    finally:
        w.close()
