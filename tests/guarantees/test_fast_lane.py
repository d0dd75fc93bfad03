"""No class worse off than under strict priority (issue 19 point 4): the fast lane.

One GPU holding model ``a``; ten NORMAL jobs of 30 s on ``a`` (warm) and one CRITICAL job
of 1,000 s on ``b`` (a 200 s cold start). ``wspt`` (p·tp/w: 15 against 125) runs the ten
NORMAL first and the CRITICAL job at 300 s; strict priority (``fifo``) starts it at once."""

from __future__ import annotations

import dataclasses

import pytest

from makespan.models import parse_fleet
from makespan.planner import fast_lane
from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate
from makespan.planner.model import PlanJob
from makespan.planner.simulator import fleet_state, simulate
from makespan.producer import Producer
from makespan.settings import Settings
from makespan.workers.planner_worker import PlannerWorker

FLEET = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                     "endpoints": {"a": {"model": "a", "memory_mib_per_gpu": 1000, "cold_start_s": 200},
                                   "b": {"model": "b", "memory_mib_per_gpu": 1000, "cold_start_s": 200}}})


def _batch(t=0.0):
    return [PlanJob(f"n{i}", "a", 2.0, t, 30.0, 2, seq=i) for i in range(10)] + \
        [PlanJob("c", "b", 8.0, t, 1000.0, 0, seq=10)]


def _state():
    st = fleet_state(FLEET, 0.0)
    for g in st.gpus:
        st.resident[g.uuid] = "a"
    return st


def test_a_plan_waiting_for_a_warm_gpu_that_completes_earlier_is_not_late():
    """One GPU busy with ``a`` until 50 s, another free with ``b`` resident; a CRITICAL job
    of ``a`` (200 s cold start): strict priority takes the free GPU at once (evict, load: done at
    305 s), the lane lets the plan wait 50 s for the warm one (done at 150 s)."""
    two = parse_fleet({"name": "two", "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920}],
                       "endpoints": {"a": {"model": "a", "memory_mib_per_gpu": 1000, "cold_start_s": 200},
                                     "b": {"model": "b", "memory_mib_per_gpu": 1000, "cold_start_s": 200}}})
    st = fleet_state(two, 0.0)
    g0, g1 = (g.uuid for g in st.gpus)
    st.resident[g0], st.free_at[g0], st.resident[g1] = "a", 50.0, "b"
    batch = [PlanJob("c", "a", 8.0, 0.0, 100.0, 0, seq=0)]
    p0 = plan(batch, st, "portfolio")
    assert p0.by_job()["c"].start_s == pytest.approx(50.0) and p0.by_job()["c"].load == "warm"
    assert fast_lane.enforce(p0, batch, st) == (p0, 0)
    q0 = plan(batch, st, "fifo")  # the cold start at once
    assert q0.by_job()["c"].end_s == pytest.approx(305.0)  # evict b (5 s), load a (200 s), run
    _rep, lane, allowed = fast_lane.lane_plan(batch, st, (0,))
    assert allowed["c"] == pytest.approx(305.0) and lane[0].end_s == pytest.approx(150.0)


def test_the_lane_job_goes_first_the_rest_keep_their_order():
    st, batch = _state(), _batch()
    p0 = plan(batch, st, "wspt")
    assert p0.by_job()["c"].start_s == pytest.approx(300.0)  # the policy pushes it behind the NORMAL jobs
    p, late = fast_lane.enforce(p0, batch, st)
    assert late == 1 and p.stats["fast_lane_late"] == 1.0
    by = p.by_job()
    assert by["c"].start_s == pytest.approx(0.0)
    assert [a.job_id for a in sorted(p.assignments, key=lambda a: a.start_s)][1:] == \
        [a.job_id for a in sorted(p0.assignments, key=lambda a: a.start_s) if a.job_id != "c"]
    assert evaluate(p, batch, st, check_times=True).objective == pytest.approx(p.objective)
    assert plan(batch, st, "wspt", lane_levels=(0,)).by_job()["c"].start_s == pytest.approx(0.0)
    # already no later than strict priority: unchanged; no lane levels: unchanged
    q0 = plan(batch, st, "fifo")
    assert fast_lane.enforce(q0, batch, st) == (q0, 0)
    assert fast_lane.enforce(p0, batch, st, levels=()) == (p0, 0)


def test_a_lane_job_waiting_on_a_dependency_is_not_in_the_lane():
    st = _state()
    batch = _batch()[:-1] + [PlanJob("c", "b", 8.0, 0.0, 1000.0, 0, seq=10, deps=("n9",))]
    p0 = plan(batch, st, "wspt")
    assert fast_lane.enforce(p0, batch, st) == (p0, 0)


def test_the_simulator_starts_critical_as_strict_priority_would():
    jobs = _batch()
    kw = dict(preemption=False, restore=False, detail=True, reservation_after_s=None)
    base = fleet_state(FLEET, 0.0)
    for g in base.gpus:
        base.resident[g.uuid] = "a"
    wait = {}
    for name, pol, lane in (("wspt", "wspt", ()), ("wspt+lane", "wspt", (0,)), ("fifo", "fifo", ())):
        rep = simulate(jobs, base, pol, lane_levels=lane, **kw)
        wait[name] = rep["wait_s"]["CRITICAL"]["p95"]
        if lane:
            assert rep["sim"]["lane_points"] >= 1 and rep["sim"]["lane_levels"] == {"0": 1.0}
    assert wait["wspt"] == pytest.approx(300.0)
    assert wait["wspt+lane"] == pytest.approx(wait["fifo"]) == pytest.approx(0.0)


@pytest.mark.parametrize("lane", ["CRITICAL", ""])
def test_the_live_planner_starts_the_critical_job_first(r, settings, lane):
    """The planner worker in-process on a real Redis, policy ``wspt``: with the lane the
    CRITICAL job is dispatched first; with ``MAKESPAN_FAST_LANE=""`` a NORMAL one is."""
    s = dataclasses.replace(settings, policy="wspt", lease_ttl_s=60.0, fast_lane=lane)
    sent = []
    w = PlannerWorker(r, s, FLEET, dispatch=lambda ctx, q: sent.append(ctx))
    try:
        prod = Producer(r, w.keys, FLEET, s)
        normal = [prod.submit({"endpoint": "a", "service_s": 30, "priority": "NORMAL"}).id for _ in range(10)]
        crit = prod.submit({"endpoint": "b", "service_s": 1000, "priority": "CRITICAL"}).id
        for _ in range(5):
            w.tick()
            if sent:
                break
    finally:
        w.close()
    assert sent, "nothing dispatched"
    assert sent[0].job_id == (crit if lane else normal[0])


def test_fast_lane_setting():
    assert Settings().fast_lane_levels == {0: 1.0, 1: 1.25}  # CRITICAL, and HIGH with a factor
    assert dataclasses.replace(Settings(), fast_lane="critical,HIGH:1.25").fast_lane_levels == {0: 1.0, 1: 1.25}
    assert dataclasses.replace(Settings(), fast_lane="").fast_lane_levels == {}


def test_the_factor_lets_the_policy_order_lane_jobs_within_their_allowed_start():
    """Two CRITICAL jobs on a warm GPU: a long one (1,000 s) released first, a short one
    (10 s). wspt runs the short one first, so the long one completes at 1,010 s: late for
    f = 1 (strict priority completes it at 1,000 s), within f = 1.1 (allowed 1,100 s)."""
    st = _state()
    batch = [PlanJob("long", "a", 8.0, 0.0, 1000.0, 0, seq=0), PlanJob("short", "a", 8.0, 0.0, 10.0, 0, seq=1)]
    p0 = plan(batch, st, "wspt")
    assert p0.by_job()["long"].start_s == pytest.approx(10.0)
    p, late = fast_lane.enforce(p0, batch, st, {0: 1.0})
    assert late == 1 and p.by_job()["long"].start_s == pytest.approx(0.0)
    assert p.by_job()["short"].start_s == pytest.approx(1000.0)  # not late: strict priority completes it then too
    assert fast_lane.enforce(p0, batch, st, {0: 1.1}) == (p0, 0)


def test_forcing_one_late_job_can_make_another_late_then_both_are_forced():
    """Three CRITICAL jobs on one warm GPU released in order a (100 s), b (100 s), c (5 s);
    a plan that runs c, b, a: a is late (start 105 > 0) and is forced first; in the
    rebuild b then follows c (c, b in the plan's order) and completes at 205 > its strict
    completion 200: forced too."""
    st = _state()
    batch = [PlanJob(x, "a", 8.0, 0.0, s, 0, seq=i) for i, (x, s) in enumerate([("a", 100.0), ("b", 100.0), ("c", 5.0)])]
    p0 = plan(batch, st, "wspt")
    assert [a.job_id for a in sorted(p0.assignments, key=lambda a: a.start_s)][0] == "c"
    p, late = fast_lane.enforce(p0, batch, st, {0: 1.0})
    starts = {a.job_id: a.start_s for a in p.assignments}
    assert starts["a"] == pytest.approx(0.0) and starts["b"] == pytest.approx(100.0)
    assert p.stats["fast_lane_forced"] >= 2.0
    assert evaluate(p, batch, st, check_times=True).objective == pytest.approx(p.objective)
