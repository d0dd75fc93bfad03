"""When leased GPUs free, across a leader change (review, 2026-12-06).

Planner A leads and leases a job on the whole 8-GPU host; A steps down and planner B, whose
clock disagrees with A's by a minute, leads and plans a job that must wait for those GPUs.
B's free time for them was the lease's ``planned_end_s``, written on A's clock: B planned
the waiting job's start (and every start behind a lease of A's) a minute early or late.
The lease's planned end is now dated on the Redis server's clock (its ``granted_ms`` plus
the planned duration ``planned_s``, against ``TIME`` read with the lease records). The
waiting job's ETA (``wait_eta``, on the server clock) shows B's plan. Two in-process planners
on the test's private prefix, each leading in turn through the real leader lock; the real
tick, dispatch captured."""

from __future__ import annotations

import dataclasses
import time

import pytest

from makespan.keys import Keys
from makespan.producer import Producer
from makespan.workers.critical_lane import CriticalLane
from makespan.workers.planner_worker import PlannerWorker
from makespan.workers.tick.clock import ManualClock
from tests.guarantees.test_preemption_bounds import EIGHT

SKEW_S = 60.0  # wall s between the two planners' clocks
_SERVICE_S = 10_000.0  # workload s (100 wall s at time_scale 0.01): the first job outlasts the skew
_ETA_TOLERANCE_S = 5.0  # wall s: the waiting job's ETA may be off by the ticks' own delays, not by the skew
_REAL_TIME = time.time


@pytest.mark.parametrize("old_leader_skew_s", [-SKEW_S, +SKEW_S])
def test_a_new_leader_plans_the_start_behind_a_lease_of_the_old_one_on_the_server_clock(
        r, keys, settings, monkeypatch, old_leader_skew_s):
    """A (its clock and its process's ``time.time`` ``old_leader_skew_s`` off) leases a
    NORMAL TP-8 job planned to run 30 + 10 000 workload s; B (the true time) plans a second
    TP-8 job behind it: its ETA is the first lease's grant on the server clock plus that
    planned duration (before: off by the skew, either way)."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    prod = Producer(r, Keys(settings.key_prefix), EIGHT, s)
    sent_a: list = []
    a = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_a.append(ctx), name="a",
                      clock=ManualClock(_REAL_TIME() + old_leader_skew_s))
    first = prod.submit({"endpoint": "big", "service_s": _SERVICE_S, "priority": "NORMAL"}).id
    monkeypatch.setattr(time, "time", lambda: _REAL_TIME() + old_leader_skew_s)  # A's process
    try:
        lock_a = a._lead()
        a.tick()
    finally:
        monkeypatch.setattr(time, "time", _REAL_TIME)
    assert [ctx.job_id for ctx in sent_a] == [first] and r.hget(keys.job(first), "state") == "leased"
    lock_a.release()  # A steps down (or died and its lock ran out)
    granted_s = int(r.hget(keys.lease(r.hget(keys.job(first), "lease")), "granted_ms")) / 1000.0
    planned_wall_s = (EIGHT.endpoints["big"].cold_start_s + _SERVICE_S) * s.time_scale
    sent_b: list = []
    b = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_b.append(ctx), name="b",
                      clock=ManualClock(_REAL_TIME()))
    lock_b = b._lead()
    try:
        assert b.token != a.token
        second = prod.submit({"endpoint": "big", "service_s": 100.0, "priority": "NORMAL"}).id
        b.tick()
    finally:
        lock_b.release()
    assert sent_b == []
    reason, eta = r.hmget(keys.job(second), "wait_reason", "wait_eta")
    assert reason == "waiting_for_gpus"
    assert float(eta) == pytest.approx(granted_s + planned_wall_s, abs=_ETA_TOLERANCE_S)


def test_the_critical_lane_of_a_new_leader_dates_a_lease_of_the_old_one_on_the_server_clock(r, keys, settings,
                                                                                           monkeypatch):
    """A, its clock a minute behind B's, leases a LOW TP-8 job planned to run 6 010 workload s
    (60.1 wall s); B's critical lane places a CRITICAL TP-8 job at once. The LOW job runs a
    minute on: the lane preempts it (before: B read its planned end as 10 workload s from now,
    within the CRITICAL job's 30 s cold start, and left the job waiting for a minute)."""
    s = dataclasses.replace(settings, lease_ttl_s=60.0, policy="portfolio")
    prod = Producer(r, Keys(settings.key_prefix), EIGHT, s)
    sent_a: list = []
    a = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_a.append(ctx), name="a",
                      clock=ManualClock(_REAL_TIME() - SKEW_S))
    cold_start_s = EIGHT.endpoints["big"].cold_start_s
    low = prod.submit({"endpoint": "big", "service_s": SKEW_S / s.time_scale + 10.0 - cold_start_s,
                       "priority": "LOW"}).id
    monkeypatch.setattr(time, "time", lambda: _REAL_TIME() - SKEW_S)  # A's process
    try:
        lock_a = a._lead()
        a.tick()
    finally:
        monkeypatch.setattr(time, "time", _REAL_TIME)
    assert [ctx.job_id for ctx in sent_a] == [low]
    lock_a.release()
    sent_b: list = []
    b = PlannerWorker(r, s, EIGHT, dispatch=lambda ctx, q: sent_b.append(ctx), name="b",
                      clock=ManualClock(_REAL_TIME()))
    lock_b = b._lead()
    try:
        critical = prod.submit({"endpoint": "big", "service_s": 100.0, "priority": "CRITICAL"}).id
        lane = CriticalLane(b.env, b.kept, b.token, b.ticking.is_set)
        out = lane.place(r.lpop(keys.planner_critical))
    finally:
        lock_b.release()
    assert out.outcome == "preempted" and [ctx.job_id for ctx in sent_b] == [critical]
    assert r.hget(keys.job(low), "state") == "queued"
