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
    # P × f × L = 525 s would pass the slowest peer's own bound: capped at f × L + slack
    assert wide["h0"] == pytest.approx(1.25 * 300.0 + fast_lane.PEER_SLACK_S)


def test_the_peer_floor_is_capped_a_little_past_the_slowest_peer_s_bound():
    """A short longest wait L: the floor is P·f·L; a burst's long L: f·L + the slack (round
    7: with 18 HIGH jobs in a batch, P·f·L let every one of them wait past strict priority's
    slowest, which then set the level's p95)."""
    j = PlanJob("h", "a", 4.0, 100.0, 10.0, 1)
    short = fast_lane.allowed_start(j, 100.0, 1.25, (30.0, 0.0, 1.4), peer_wait_s=40.0)
    assert short == pytest.approx(100.0 + 1.4 * 1.25 * 40.0)  # 70 s: under f·L + 60 = 110 s
    long = fast_lane.allowed_start(j, 100.0, 1.25, (30.0, 0.0, 1.4), peer_wait_s=340.0)
    assert long == pytest.approx(100.0 + 1.25 * 340.0 + fast_lane.PEER_SLACK_S)  # not 1.4 × 1.25 × 340
    own = fast_lane.allowed_start(j, 600.0, 1.25, (30.0, 0.0, 1.4), peer_wait_s=340.0)
    assert own == pytest.approx(100.0 + 1.25 * 500.0 + 30.0)  # the job's own bound still wins when later


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


# -- round 7: the rule's preemptions on the burst window (bench/RESULTS.md, "HIGH's burst window, round 7")
TWO = parse_fleet({"name": "two", "hosts": [{"name": "h", "gpu_count": 2, "memory_mib": 81920}],
                   "endpoints": {"a": {"model": "a", "memory_mib_per_gpu": 1000, "cold_start_s": 60},
                                 "slow": {"model": "slow", "memory_mib_per_gpu": 1000, "cold_start_s": 1000},
                                 "quick": {"model": "quick", "memory_mib_per_gpu": 1000, "cold_start_s": 10}}})
LANE, GRACE = {0: 1.0, 1: 1.25}, {0: 30.0, 1: 30.0}


def _two_held(holders: list[tuple[PlanJob, float, float]], now_s: float = 100.0):
    """Both GPUs of TWO held: ``holders`` = (job, start s, end s) on GPU 0 and GPU 1."""
    st = fleet_state(TWO, 0.0)
    st.now_s = now_s
    for gpu, (job, start, end) in zip((g.uuid for g in st.gpus), holders):
        st.free_at[gpu], st.resident[gpu] = end, job.endpoint
        st.running[gpu] = RunningJob(job, (gpu,), start, start, end, True)
    return st


def _rule(st, batch):
    out = fast_lane.rule_preemptions(preemption_plan.Branch(st, batch, None, [], [], []), LANE, GRACE)
    return [(x.job_id, x.victims) for x in out.taken]


def test_the_rule_s_test_looks_at_the_gpus_the_lane_jobs_ahead_leave():
    """GPU 0 frees at 150 (within `a`'s 60 s cold start from now, 100), GPU 1 at 1,100. The
    first HIGH job waits for GPU 0; the second would wait for GPU 1 (or for the first to end):
    strict priority with the rule preempts for it. On the raw free times (GPU 0 at 150) the
    rule declined for both."""
    l0, l1 = PlanJob("l0", "a", 1.0, 0.0, 150.0, 3, seq=0), PlanJob("l1", "a", 1.0, 0.0, 1010.0, 3, seq=1)
    st = _two_held([(l0, 0.0, 150.0), (l1, 90.0, 1100.0)])
    h0, h1 = PlanJob("h0", "a", 4.0, 100.0, 1000.0, 1, seq=2), PlanJob("h1", "a", 4.0, 100.0, 1000.0, 1, seq=3)
    assert _rule(st, [h0, h1]) == [("h1", ("l1",))]


def test_a_high_rule_preemption_goes_on_while_a_critical_job_waits_for_other_gpus():
    """The CRITICAL job (`slow`, 1,000 s cold start) waits for GPU 0 (free at 600: no
    preemption for it). The HIGH job preempts the LOW job on GPU 1, which the CRITICAL job
    does not need; before round 7 any waiting CRITICAL job blocked every HIGH preemption."""
    l0, l1 = PlanJob("l0", "slow", 1.0, 0.0, 600.0, 3, seq=0), PlanJob("l1", "slow", 1.0, 0.0, 2000.0, 3, seq=1)
    st = _two_held([(l0, 0.0, 600.0), (l1, 0.0, 2000.0)])
    crit = PlanJob("crit", "slow", 8.0, 100.0, 200.0, 0, seq=2)
    high = PlanJob("high", "quick", 4.0, 100.0, 1000.0, 1, seq=3)
    assert _rule(st, [crit, high]) == [("high", ("l1",))]


def test_a_critical_preemption_spares_a_high_job_that_just_started():
    """GPU 0: a HIGH job 4 s into its run; GPU 1: a LOW job 34 s into its own. The least lost
    work alone picked the HIGH job (its wait then restarts); the candidate order takes the LOW
    one, and between NORMAL and LOW victims the least *weighted* lost work."""
    hi, lo = PlanJob("hi", "quick", 4.0, 0.0, 1000.0, 1, seq=0), PlanJob("lo", "quick", 1.0, 0.0, 1000.0, 3, seq=1)
    st = _two_held([(hi, 96.0, 1096.0), (lo, 66.0, 1066.0)])
    crit = PlanJob("crit", "a", 8.0, 100.0, 100.0, 0, seq=2)
    assert [c.victims[0].id for c in preemption_plan.candidates(crit, st, [crit], per_job=2)] == ["lo", "hi"]
    assert _rule(st, [crit]) == [("crit", ("lo",))]
    norm, low = PlanJob("n", "quick", 2.0, 0.0, 1000.0, 2, seq=0), PlanJob("l", "quick", 1.0, 0.0, 1000.0, 3, seq=1)
    st = _two_held([(norm, 90.0, 1090.0), (low, 0.0, 1000.0)])  # NORMAL: 2 × 10 weight·s lost; LOW: 1 × 100
    assert [c.victims[0].id for c in preemption_plan.candidates(crit, st, [crit], per_job=2)] == ["n", "l"]


def test_rule_preemptions_per_call_are_capped_in_lane_order(monkeypatch):
    """A burst on a full fleet: every GPU held by a LOW job for 1,000 s more, more CRITICAL
    jobs than the cap. One call takes RULE_PREEMPTION_BUDGET preemptions, for the first
    jobs in lane order; a second call on the state it leaves takes the next ones."""
    n_gpus = 8
    fleet = parse_fleet({"name": "eight", "hosts": [{"name": "h", "gpu_count": n_gpus, "memory_mib": 81920}],
                         "endpoints": ONE.model_dump()["endpoints"]})
    st = fleet_state(fleet, 0.0)
    st.now_s = 100.0
    for n, gpu in enumerate(g.uuid for g in st.gpus):
        low = PlanJob(f"low{n}", "a", 1.0, 0.0, 1100.0, 3, seq=n)
        st.free_at[gpu], st.resident[gpu] = 1100.0, "a"
        st.running[gpu] = RunningJob(low, (gpu,), 0.0, 0.0, 1100.0, True)
    crits = [PlanJob(f"c{i}", "quick", 8.0, 100.0, 50.0, 0, seq=100 + i) for i in range(6)]
    monkeypatch.setattr(fast_lane, "RULE_PREEMPTION_BUDGET", 4)
    first = fast_lane.rule_preemptions(preemption_plan.Branch(st, crits, None, [], [], []), LANE, GRACE)
    assert [x.job_id for x in first.taken] == ["c0", "c1", "c2", "c3"]
    second = fast_lane.rule_preemptions(first, LANE, GRACE)
    assert [x.job_id for x in second.taken] == ["c0", "c1", "c2", "c3", "c4", "c5"]
    monkeypatch.setattr(fast_lane, "RULE_PREEMPTION_BUDGET", 16)  # the default: a call of 8 GPUs never reaches it
    uncapped = fast_lane.rule_preemptions(preemption_plan.Branch(st, crits, None, [], [], []), LANE, GRACE)
    assert [x.job_id for x in uncapped.taken] == [f"c{i}" for i in range(6)]
