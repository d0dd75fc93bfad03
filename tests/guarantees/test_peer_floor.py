"""HIGH in the fast lane by default (issue 19 point 4, fifth round): the peer floor and the
higher-level guard on the lane's rule preemptions (planner/fast_lane.py, "Peer floor" and
"Preemption")."""

from __future__ import annotations

import pytest

from makespan.errors import ValidationError
from makespan.models import parse_fleet
from makespan.planner import fast_lane, preemption_plan
from makespan.planner.api import plan
from makespan.planner.model import PlanJob, RunningJob
from makespan.planner.simulator import fleet_state
from makespan.settings import Settings, fast_lane_start_grace

ONE = parse_fleet({"name": "one", "hosts": [{"name": "h", "gpu_count": 1, "memory_mib": 81920}],
                   "endpoints": {"a": {"model": "a", "memory_mib_per_gpu": 1000, "cold_start_s": 60},
                                 "slow": {"model": "slow", "memory_mib_per_gpu": 1000, "cold_start_s": 1000},
                                 "quick": {"model": "quick", "memory_mib_per_gpu": 1000, "cold_start_s": 10}}})


def _warm_one():
    st = fleet_state(ONE, 0.0)
    st.resident[st.gpus[0].uuid] = "a"
    return st


def _normals_then_two_high():
    """Three NORMAL jobs of 40 s and two HIGH jobs of 300 s, all released at 0 on one warm
    GPU. Strict priority starts the HIGH jobs at 0 and 300 (the level's longest strict wait
    is 300 s); weighted completion runs the NORMAL jobs first (HIGH at 120 and 420)."""
    batch = [PlanJob(f"n{i}", "a", 2.0, 0.0, 40.0, 2, seq=i) for i in range(3)]
    batch += [PlanJob("h0", "a", 4.0, 0.0, 300.0, 1, seq=3), PlanJob("h1", "a", 4.0, 0.0, 300.0, 1, seq=4)]
    return batch


def test_the_peer_floor_lets_a_job_wait_as_long_as_its_level_s_longest_strict_waiter():
    st, batch = _warm_one(), _normals_then_two_high()
    _rep, _lane, plain = fast_lane.lane_plan(batch, st, {1: 1.0}, {1: 30.0})
    _rep, _lane, peer = fast_lane.lane_plan(batch, st, {1: 1.0}, {1: (30.0, 0.0, 1.0)})
    assert plain == pytest.approx({"h0": 30.0, "h1": 330.0})  # r + (S* − r) + 30
    assert peer == pytest.approx({"h0": 300.0, "h1": 330.0})  # h0 never before r + 1.0 × 300
    _rep, _lane, wide = fast_lane.lane_plan(batch, st, {1: 1.25}, {1: (30.0, 0.0, 1.4)})
    assert wide["h0"] == pytest.approx(1.4 * 1.25 * 300.0)  # P × f × the longest strict wait


def test_the_peer_floor_forces_only_the_job_that_stretches_the_tail():
    st, batch = _warm_one(), _normals_then_two_high()
    p0 = plan(batch, st, "wspt")
    assert (p0.by_job()["h0"].start_s, p0.by_job()["h1"].start_s) == pytest.approx((120.0, 420.0))
    _p, late_plain = fast_lane.enforce(p0, batch, st, {1: 1.0}, start_grace_s={1: 30.0})
    p, late_peer = fast_lane.enforce(p0, batch, st, {1: 1.0}, start_grace_s={1: (30.0, 0.0, 1.0)})
    assert late_plain == 2  # without the floor, both HIGH jobs are late (120 > 30, 420 > 330)
    assert late_peer == 1  # h0 at 120 is within its peer floor (300); h1 is not
    starts = {jid: a.start_s for jid, a in p.by_job().items()}
    assert starts["h1"] <= 330.0 + 1e-6 and starts["h0"] <= 300.0 + 1e-6


def test_peer_floor_parses_and_the_defaults_agree():
    assert fast_lane_start_grace("HIGH:30/x1.4") == {1: (30.0, 0.0, 1.4)}
    assert fast_lane_start_grace("HIGH:30/200/x1.5") == {1: (30.0, 200.0, 1.5)}
    assert fast_lane_start_grace("CRITICAL:30,HIGH:60/200") == {0: 30.0, 1: (60.0, 200.0)}
    for bad in ("HIGH:30/x0", "HIGH:30/x-1", "HIGH:30/xabc", "HIGH:30/xinf"):
        with pytest.raises(ValidationError, match="peer factor"):
            fast_lane_start_grace(bad)
    s = Settings()
    assert s.fast_lane_levels == fast_lane.factors(fast_lane.DEFAULT_LANE_LEVELS) == {0: 1.0, 1: 1.25}
    assert s.fast_lane_start_grace == fast_lane.DEFAULT_START_GRACE == {0: 30.0, 1: (30.0, 0.0, 1.4)}


def _busy_one(now_s: float = 100.0):
    """One GPU held by a LOW job of ``slow`` until ``now_s`` + 500."""
    st = fleet_state(ONE, 0.0)
    (gpu,) = (g.uuid for g in st.gpus)
    low = PlanJob("low", "slow", 1.0, 0.0, 1000.0, 3, seq=0)
    st.now_s, st.free_at[gpu], st.resident[gpu] = now_s, now_s + 500.0, "slow"
    st.running = {gpu: RunningJob(low, (gpu,), 0.0, 0.0, now_s + 500.0, True)}
    return st


def test_a_high_rule_preemption_waits_while_a_critical_job_waits():
    """The CRITICAL job (``slow``: a 1,000 s cold start) takes no preemption itself: the GPU
    frees within its cold start (at 600). The HIGH job (``quick``, 10 s, 1,000 s of service)
    would preempt the LOW job under the rule and then hold the GPU the CRITICAL job waits
    for until 1,110: it does not while the CRITICAL job waits, and does once nothing of a
    higher level waits."""
    levels, grace = {0: 1.0, 1: 1.25}, {0: 30.0, 1: 30.0}
    crit = PlanJob("crit", "slow", 8.0, 100.0, 200.0, 0, seq=1)
    high = PlanJob("high", "quick", 4.0, 100.0, 1000.0, 1, seq=2)
    st = _busy_one()
    both = fast_lane.rule_preemptions(preemption_plan.Branch(st, [crit, high], None, [], [], []), levels, grace)
    assert both.taken == []
    alone = fast_lane.rule_preemptions(preemption_plan.Branch(_busy_one(), [high], None, [], [], []), levels, grace)
    assert [(x.job_id, x.victims) for x in alone.taken] == [("high", ("low",))]
    p = plan([crit, high], _busy_one(), "default", preemption=True, lane_levels=levels, lane_start_grace_s=grace,
             time_limit_s=0.05)
    assert p.by_job()["crit"].start_s <= 600.0 + 1e-6  # when the LOW job ends, not after the HIGH job
