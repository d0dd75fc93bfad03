"""The minimum runtime before preemption across a leader change (review, 2026-12-06).

Planner A leads and leases a LOW job; A steps down and planner B, whose clock disagrees
with A's by a minute, leads and sees a HIGH gang that only a preemption of the LOW job can
start. The time the LOW job has held its GPUs was ``B's clock − leased_at`` with
``leased_at`` on A's clock, so B preempted a job that had just started (A's clock behind)
or refused to preempt one it should (A's clock ahead). It is now measured on the Redis
server's clock (the lease record's ``granted_ms`` against ``TIME``). Two in-process
planners on the test's private prefix, each leading in turn through the real leader lock;
the real tick, dispatch captured."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from makespan.keys import Keys
from makespan.producer import Producer
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from tests.guarantees.test_preemption_bounds import EIGHT

SKEW_S = 60.0  # wall s between the two planners' clocks
_LOW_SERVICE_S = 100_000.0  # workload s: the LOW job would run long past the skew (preempting it helps)
_REAL_TIME = time.time


def _preempted(r, keys) -> list[str]:
    events = [json.loads(f["e"]) for _i, f in r.xrange(keys.events)]
    return [e["job"] for e in events if e["kind"] == "preempted"]


def _failover(r, settings, monkeypatch, mode: str, old_leader_skew_s: float, min_runtime_s: float) -> tuple[str, list]:
    """A (its clock and its process's ``time.time`` ``old_leader_skew_s`` off) leads and
    leases a LOW TP-4 job; A gives up the lock; B (the true time) leads, a HIGH TP-8 job
    is submitted and B ticks. Returns the LOW job's id and B's dispatches."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0, preemption=mode, policy="portfolio",
                            preemption_min_runtime_s=min_runtime_s)
    prod = Producer(r, Keys(settings.key_prefix), EIGHT, s)
    sent_a: list = []
    a = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_a.append(ctx), name="a",
                      clock=ManualClock(_REAL_TIME() + old_leader_skew_s))
    low = prod.submit({"endpoint": "small", "service_s": _LOW_SERVICE_S, "priority": "LOW"}).id
    monkeypatch.setattr(time, "time", lambda: _REAL_TIME() + old_leader_skew_s)  # A's process
    try:
        lock_a = a._lead()
        a.tick()
    finally:
        monkeypatch.setattr(time, "time", _REAL_TIME)
    assert [ctx.job_id for ctx in sent_a] == [low] and r.hget(a.keys.job(low), "state") == "leased"
    lock_a.release()  # A steps down (or died and its lock ran out)
    sent_b: list = []
    b = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_b.append(ctx), name="b",
                      clock=ManualClock(_REAL_TIME()))
    lock_b = b._lead()
    try:
        assert b.token != a.token
        prod.submit({"endpoint": "big", "service_s": 300.0, "priority": "HIGH"})
        for _ in range(3):
            b.tick()
    finally:
        lock_b.release()
    return low, sent_b


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_new_leader_whose_clock_runs_ahead_does_not_preempt_a_job_that_just_started(r, keys, settings,
                                                                                        monkeypatch, mode):
    """The minimum runtime is 30 wall s (3000 workload s at time_scale 0.01); A's clock was
    a minute behind B's: B measured 60 s held and preempted the LOW job at once."""
    low, sent_b = _failover(r, settings, monkeypatch, mode, old_leader_skew_s=-SKEW_S,
                            min_runtime_s=30.0 / settings.time_scale)
    assert _preempted(r, keys) == [] and sent_b == []
    assert r.hget(keys.job(low), "state") == "leased"
    # once the lease has held its GPUs the minimum runtime on the server clock, B preempts it
    lease = keys.lease(r.hget(keys.job(low), "lease"))
    r.hset(lease, "granted_ms", int(r.hget(lease, "granted_ms")) - 31_000)
    b = PlannerWorker(r, dataclasses.replace(settings, lease_ttl_s=60.0, preemption=mode, policy="portfolio",
                                             preemption_min_runtime_s=30.0 / settings.time_scale),
                      EIGHT, dispatch=lambda ctx, q: sent_b.append(ctx), name="b", clock=ManualClock(_REAL_TIME()))
    lock_b = b._lead()
    try:
        b.tick()
    finally:
        lock_b.release()
    assert _preempted(r, keys) == [low] and [len(ctx.gpus) for ctx in sent_b] == [8]


@pytest.mark.parametrize("mode", ["plan", "rule"])
def test_a_new_leader_whose_clock_runs_behind_still_preempts(r, keys, settings, monkeypatch, mode):
    """No minimum runtime (the default 0); A's clock was a minute ahead of B's: B measured
    −60 s held, below 0, and never preempted the LOW job for the HIGH gang."""
    low, sent_b = _failover(r, settings, monkeypatch, mode, old_leader_skew_s=+SKEW_S, min_runtime_s=0.0)
    assert _preempted(r, keys) == [low]
    assert [len(ctx.gpus) for ctx in sent_b] == [8]
