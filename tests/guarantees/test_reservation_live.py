"""The aged job's reservation in the live planner, past the two steps that used to lose it
(found by a review, 2026-12-04): a plan kept for following (workers/follow.py) while one of
its jobs reaches the aging bound, and the fast lane's re-plan of the other jobs
(planner/fast_lane.py) when a HIGH job is late. Real Redis, in-process ticks on a manual
clock, at the tests' time scale and at production's (1.0: the workload clock ~1.8e9 s)."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from makespan.models import parse_fleet
from makespan.planner import api
from makespan.producer import Producer
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick import steps
from makespan.workers.tick.clock import ManualClock

FLEET = parse_fleet({"name": "two-by-four", "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920},
                                                       {"name": "b", "gpu_count": 4, "memory_mib": 81920}],
                     "endpoints": {"e": {"model": "m", "memory_mib_per_gpu": 1000, "cold_start_s": 20},
                                   "x": {"model": "xm", "memory_mib_per_gpu": 1000, "cold_start_s": 200},
                                   "four": {"model": "g", "tensor_parallel": 4, "memory_mib_per_gpu": 1000,
                                            "cold_start_s": 20}}})


def _setup(r, settings, **changes):
    s = dataclasses.replace(settings, lease_ttl_s=600.0, policy="portfolio", **changes)
    sent: list[PhaseContext] = []
    clock = ManualClock(time.time())
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx), clock=clock)
    return w, Producer(r, w.keys, FLEET, s), sent, clock


def _running(r, w, prod, gpu, service_s, endpoint="e") -> PhaseContext:
    """A NORMAL job holding ``gpu``, planned to end ``service_s`` workload s from now."""
    job_id = prod.submit({"endpoint": endpoint, "service_s": service_s, "priority": "NORMAL"}).id
    lease = LeaseStore(r, w.keys).acquire(uuid.uuid4().hex, (gpu,), w.settings.lease_ttl_s, job_id=job_id,
                                          kind="job", holder=w.fleet.host_of(gpu), queue=w.keys.queue("NORMAL"),
                                          info={"planned_end_s": repr(w.now_s() + service_s), "endpoint": endpoint,
                                                "priority": "NORMAL"})
    assert lease is not None
    r.hset(w.keys.phase(lease.lease_id), "evict:claimed", "1")
    return PhaseContext(lease.lease_id, lease.token, [gpu], w.fleet.host_of(gpu), "job", endpoint, job_id,
                        "NORMAL", service_s)


def _fill(r, w, prod, ends, endpoint_of=lambda gpu: "e"):
    return {f"GPU-{host}-{i}": _running(r, w, prod, f"GPU-{host}-{i}", end_s, endpoint_of(f"GPU-{host}-{i}"))
            for host, xs in ends.items() for i, end_s in enumerate(xs) if end_s is not None}


@pytest.mark.parametrize("time_scale", [0.01, 1.0])
def test_a_job_that_ages_while_the_plan_is_followed_gets_its_reservation(r, settings, time_scale):
    """The gang is 0.3 wall s short of the aging bound when the plan is made (the 500 s job
    first on a-0, correctly), and ages 0.4 wall s later, inside ``plan_follow_s`` (1 s), when
    a-0 is released: the tick must plan (host a reserved) and hold the 500 s job back, not
    follow the kept plan onto a-0."""
    w, prod, sent, clock = _setup(r, settings, time_scale=time_scale)
    running = _fill(r, w, prod, {"a": [50.0, 100.0, 200.0, 400.0], "b": [5000.0] * 4})
    gang = prod.submit({"endpoint": "four", "service_s": 600, "priority": "NORMAL"}).id
    r.hset(w.keys.job(gang), "submitted_at", repr(clock.now() - w.settings.reservation_after_s * time_scale + 0.3))
    long_ = prod.submit({"endpoint": "e", "service_s": 500, "priority": "NORMAL"}).id
    w.tick()
    assert sent == [] and w.kept.followed is not None
    clock.advance(0.4)
    assert PhaseRunner(r, w.settings, FLEET)._finish(running["GPU-a-0"], "completed", "") == "completed"
    w.tick()
    assert long_ not in [c.job_id for c in sent], "a followed tick started a job past the aged gang's reservation"
    assert r.hget(w.keys.job(gang), "wait_reason") == "reserved"


@pytest.mark.parametrize("time_scale", [0.01, 1.0])
def test_the_fast_lane_keeps_the_reservation_when_a_high_job_is_late(r, settings, time_scale):
    """A HIGH job late for the lane takes the free a-0 (a higher level may take the reserved
    group); the lane's re-plan of the other jobs used to put the NORMAL 500 s job on a-1 now,
    past the aged gang's reservation of host a, and won on score."""
    w, prod, sent, clock = _setup(r, settings, time_scale=time_scale)
    _fill(r, w, prod, {"a": [None, None, 200.0, 400.0], "b": [100.0, 5000.0, 5000.0, 5000.0]},
          endpoint_of=lambda gpu: "x" if gpu == "GPU-b-0" else "e")
    r.set(w.keys.resident("GPU-b-0"), "x@GPU-b-0")  # a warm x instance, busy for 100 s
    gang = prod.submit({"endpoint": "four", "service_s": 600, "priority": "NORMAL"}).id
    r.hset(w.keys.job(gang), "submitted_at", repr(clock.now() - (w.settings.reservation_after_s + 100.0) * time_scale))
    long_ = prod.submit({"endpoint": "e", "service_s": 500, "priority": "NORMAL"}).id
    high = prod.submit({"endpoint": "x", "service_s": 100, "priority": "HIGH"}).id
    clock.advance(0.01)
    w.tick()
    started = {c.job_id: c.gpus for c in sent}
    assert high in started and long_ not in started, started
    assert r.hget(w.keys.job(gang), "wait_reason") == "reserved"


def test_the_pure_planner_keeps_the_reservation_through_the_lane(r, settings, monkeypatch):
    """The same batch through ``api.plan`` with the reservation and the lane (what the
    simulator calls): no job of the gang's level holds a reserved GPU past the reservation."""
    seen = {}
    real = steps.plan

    def spy(batch, state, *args, **kwargs):
        seen["batch"], seen["state"] = batch, state
        return real(batch, state, *args, **kwargs)

    monkeypatch.setattr(steps, "plan", spy)
    w, prod, sent, clock = _setup(r, settings, time_scale=1.0)
    _fill(r, w, prod, {"a": [None, None, 200.0, 400.0], "b": [100.0, 5000.0, 5000.0, 5000.0]},
          endpoint_of=lambda gpu: "x" if gpu == "GPU-b-0" else "e")
    r.set(w.keys.resident("GPU-b-0"), "x@GPU-b-0")
    gang = prod.submit({"endpoint": "four", "service_s": 600, "priority": "NORMAL"}).id
    r.hset(w.keys.job(gang), "submitted_at", repr(clock.now() - (w.settings.reservation_after_s + 100.0)))
    long_ = prod.submit({"endpoint": "e", "service_s": 500, "priority": "NORMAL"}).id
    prod.submit({"endpoint": "x", "service_s": 100, "priority": "HIGH"})
    clock.advance(0.01)
    w.tick()
    batch, state = seen["batch"], seen["state"]
    s = w.settings
    p = api.plan(batch, state, "portfolio", reserve_after_s=s.reservation_after_s, lane_levels=s.fast_lane_levels,
                 lane_start_grace_s=s.fast_lane_start_grace)
    by_job = p.by_job()
    gang_at, long_at = by_job[gang], by_job[long_]
    assert p.stats.get("reserved") == 1.0
    assert (set(long_at.gpus).isdisjoint(gang_at.gpus) or long_at.end_s <= gang_at.start_s + 1e-6
            or long_at.start_s >= gang_at.end_s - 1e-6), (long_at, gang_at)


@pytest.mark.parametrize("delayed", [False, True])
def test_a_delay_is_not_counted_as_waiting_for_the_aging_bound(r, settings, delayed):
    """A job submitted with delay_s (or waiting out a retry backoff) is released when it is
    due (its record's not_before), not at its submission: a job delayed past the aging bound
    was aged, and got a reservation, the moment it was queued (found by a review)."""
    w, prod, _sent, clock = _setup(r, settings, time_scale=0.01)
    _fill(r, w, prod, {"a": [200.0, 200.0, 200.0, 400.0], "b": [300.0, 5000.0, 5000.0, 5000.0]})
    gang = prod.submit({"endpoint": "four", "service_s": 600, "priority": "NORMAL"}).id
    submitted = clock.now() - (w.settings.reservation_after_s + 100.0) * 0.01
    r.hset(w.keys.job(gang), "submitted_at", repr(submitted))
    if delayed:  # due 10 workload s ago: it has waited 10 s, not the aging bound
        r.hset(w.keys.job(gang), "not_before", repr(clock.now() - 10.0 * 0.01))
    clock.advance(0.01)
    w.tick()
    assert (r.hget(w.keys.job(gang), "wait_reason") == "reserved") is not delayed


def test_the_release_of_a_job_that_was_delayed_is_its_due_time():
    from makespan.workers.tick.clock import release_s

    assert release_s("100.0", None, 1.0, 1000.0) == 100.0
    assert release_s("100.0", "", 1.0, 1000.0) == 100.0
    assert release_s("100.0", "700.0", 1.0, 1000.0) == 700.0
    assert release_s("100.0", "700.0", 0.01, 50_000.0) == 50_000.0  # never after now
    assert release_s(5000.0, None, 1.0, 1000.0) == 1000.0  # a producer clock ahead: now
