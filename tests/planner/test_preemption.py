"""Preemption: the shared rule (makespan.planner.preemption) and the simulator's use of it."""

import random

import pytest

from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.preemption import Holder, choose_preemption, may_preempt
from makespan.planner.simulator import simulate

EPS = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0),
       "m3": EndpointModel("m3", 1, 1000, 120.0, 5.0), "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0)}


def _state(n=2, resident=None):
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(n)]
    return FleetState(0.0, gpus, EPS, resident=dict(resident or {}), set_point={})


def _job(jid, ep, level, release_s, service_s, seq):
    return PlanJob(jid, ep, float({0: 8, 1: 4, 2: 2, 3: 1}[level]), release_s, service_s, level, seq=seq)


def _lows_then(level, low_service_s=1000.0, arrival_s=100.0, ep="m1"):
    return [_job("L1", "m2", 3, 0.0, low_service_s, 0), _job("L2", "m2", 3, 0.0, low_service_s, 1),
            _job("X", ep, level, arrival_s, 50.0, 2)]


def test_levels():
    assert may_preempt(0, 1) and may_preempt(0, 3) and may_preempt(1, 2) and may_preempt(1, 3)
    assert not may_preempt(1, 1) and not may_preempt(1, 0) and not may_preempt(2, 3) and not may_preempt(3, 3)


def test_rule_picks_the_cheapest_group_and_skips_free_or_soon_free():
    groups = [("g0", "g1"), ("g2", "g3")]
    free_at = {u: 500.0 for u in ("g0", "g1", "g2", "g3")}
    busy = set(free_at)
    holders = {"g0": Holder("a", 2), "g1": Holder("b", 2), "g2": Holder("c", 3), "g3": Holder("c", 3)}
    got = choose_preemption(0, groups, busy, free_at, 0.0, 40.0, holders)
    assert got is not None and got.group == ("g2", "g3") and got.victims == ("c",) and got.cost == 1.0
    assert choose_preemption(2, groups, busy, free_at, 0.0, 40.0, holders) is None  # NORMAL never preempts
    assert choose_preemption(0, groups, busy - {"g2", "g3"}, free_at, 0.0, 40.0, holders) is None  # a free group
    soon = dict(free_at, g0=30.0, g1=40.0)
    assert choose_preemption(0, groups, busy, soon, 0.0, 40.0, holders) is None  # frees within the cold start
    hold = dict(holders, g2=Holder("c", 3, preemptable=False))  # e.g. a restore, or a job that only clears
    assert choose_preemption(0, groups, busy, free_at, 0.0, 40.0, hold).group == ("g0", "g1")
    same = {u: Holder(u, 1) for u in busy}  # HIGH does not preempt HIGH
    assert choose_preemption(1, groups, busy, free_at, 0.0, 40.0, same) is None
    part = dict(holders, g3=None)  # part of the group is held by nothing preemptable
    assert choose_preemption(0, groups, busy, free_at, 0.0, 40.0, part).group == ("g0", "g1")


def _sim(jobs, n=2, preemption="rule", restore=False, resident=None):
    return simulate(jobs, _state(n, resident), "portfolio", preemption=preemption, restore=restore, detail=True)


def _rec(rep, jid):
    return next(r for r in rep["schedule"]["jobs"] if r["id"] == jid)


@pytest.mark.parametrize("level", [0, 1])
def test_critical_or_high_behind_long_low_jobs_preempts(level):
    rep = _sim(_lows_then(level))
    assert rep["jobs"]["preempted"] == 1
    x = _rec(rep, "X")
    assert x["start_s"] == 100.0  # at its arrival, not after a LOW job's 1060 s
    (p,) = rep["schedule"]["preemptions"]
    assert p["job"] == "X" and p["t_s"] == 100.0 and p["victims"][0] in ("L1", "L2")
    assert rep["sim"]["preempted_gpu_s"] == pytest.approx(100.0)


def test_normal_behind_long_low_jobs_waits():
    rep = _sim(_lows_then(2))
    assert rep["jobs"]["preempted"] == 0 and _rec(rep, "X")["start_s"] >= 1000.0


def test_preemption_off_waits():
    rep = _sim(_lows_then(0), preemption=False)
    assert rep["jobs"]["preempted"] == 0 and rep["sim"]["preemption"] is False
    assert _rec(rep, "X")["start_s"] >= 1000.0


def test_no_preemption_when_a_group_frees_within_the_cold_start():
    # the LOW jobs end at 60 + 100 = 160 s; X (m3, cold start 120 s) arrives at 100 s and
    # is planned at 160 s, after the 30 s window: 60 s ≤ 120 s, so it waits
    rep = _sim(_lows_then(0, low_service_s=100.0, ep="m3"))
    assert rep["jobs"]["preempted"] == 0 and _rec(rep, "X")["start_s"] == pytest.approx(160.0)
    # ending at 60 + 200 = 260 s: 160 s > 120 s, so preempting starts it sooner
    rep = _sim(_lows_then(0, low_service_s=200.0, ep="m3"))
    assert rep["jobs"]["preempted"] == 1 and _rec(rep, "X")["start_s"] == 100.0


def test_victim_not_re_leased_its_lost_gpus_before_the_preemptor_starts():
    # one GPU: the victim has nowhere else to go, and the preemptor holds the GPU until it ends
    jobs = [_job("L", "m2", 3, 0.0, 1000.0, 0), _job("C", "m1", 0, 100.0, 50.0, 1)]
    rep = _sim(jobs, n=1)
    c, low = _rec(rep, "C"), _rec(rep, "L")
    assert rep["jobs"]["preempted"] == 1 and c["start_s"] == 100.0
    assert low["start_s"] >= c["end_s"] and low["end_s"] == pytest.approx(c["end_s"] + 65.0 + 1000.0)


def _mixed_stream(seed, n=120):
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 20.0)
        lvl = rng.choices([0, 1, 2, 3], [1, 2, 3, 4])[0]
        ep = rng.choice(["m1", "m2", "t2"])
        jobs.append(_job(f"j{i}", ep, lvl, t, rng.uniform(20, 600) * (3 if lvl == 3 else 1), i))
    return jobs


def _busy_intervals(rep):
    sched = rep["schedule"]
    out = [(r["start_s"], r["end_s"], tuple(r["gpus"]), r["id"]) for r in sched["jobs"]]
    out += [(a, b, tuple(g), "restore") for a, b, g in sched["restores"]]
    out += [(a, b, tuple(g), "lost") for a, b, g in sched["lost"]]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_job_lost_and_no_gpu_double_booked(seed):
    jobs = _mixed_stream(seed)
    rep = _sim(jobs, n=4, restore=True, resident={"g0": "m1", "g1": "m1"})
    ids = [r["id"] for r in rep["schedule"]["jobs"]]
    assert sorted(ids) == sorted(j.id for j in jobs)  # every job completes exactly once
    assert rep["jobs"]["completed"] == rep["jobs"]["submitted"] == len(jobs)
    assert rep["jobs"]["preempted"] == len(rep["schedule"]["lost"]) > 0  # the stream does preempt
    by_gpu: dict[str, list] = {}
    for a, b, gs, who in _busy_intervals(rep):
        for u in gs:
            by_gpu.setdefault(u, []).append((a, b, who))
    for u, iv in by_gpu.items():
        iv.sort()
        for (a1, b1, w1), (a2, b2, w2) in zip(iv, iv[1:]):
            assert a2 >= b1 - 1e-6, f"{u}: {w1} [{a1}, {b1}) overlaps {w2} [{a2}, {b2})"
    for p in rep["schedule"]["preemptions"]:
        pre = _rec(rep, p["job"])
        for v in p["victims"]:
            vr = _rec(rep, v)
            assert not set(vr["gpus"]) & set(p["gpus"]) or vr["start_s"] >= pre["start_s"]
            assert vr["submit_s"] == next(j.release_s for j in jobs if j.id == v)  # original submission


def test_a_preemptor_waits_for_its_dependency():
    """C depends on D, both CRITICAL behind two long LOW jobs: D may preempt at once, C
    only starts after D completes (the simulator's batch holds jobs whose dependencies
    are still running; the live batch does not)."""
    from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
    from makespan.planner.simulator import simulate

    eps = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0)}
    st = FleetState(0.0, [Gpu(f"g{i}", "a", i, 80000) for i in range(2)], eps, set_point={})
    jobs = [PlanJob("L1", "m2", 1.0, 0.0, 1000.0, 3, seq=0), PlanJob("L2", "m2", 1.0, 0.0, 1000.0, 3, seq=1),
            PlanJob("D", "m1", 8.0, 100.0, 50.0, 0, seq=2), PlanJob("C", "m1", 8.0, 100.0, 50.0, 0, deps=("D",), seq=3)]
    rep = simulate(jobs, st, "portfolio", restore=False, detail=True)
    rec = {r["id"]: r for r in rep["schedule"]["jobs"]}
    assert rec["C"]["start_s"] >= rec["D"]["end_s"]
    assert rep["jobs"]["completed"] == 4
