"""No starvation (issue 19 point 1): aging, then a reservation with backfill.

The scenario of the issue: 8 GPUs in 2 hosts of 4; a NORMAL TP-4 job of 600 s submitted
at t = 1,800 s; a NORMAL TP-1 job of 300 s every 38 s for 4 h. Before: the TP-4 job
waited 212 minutes (it ran when the stream ended)."""

from __future__ import annotations

import pytest

from makespan.models import parse_fleet
from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate
from makespan.planner.model import PlanJob
from makespan.planner.reservation import DEFAULT_RESERVATION_AFTER_S, enforce
from makespan.planner.simulator import fleet_state, simulate

FLEET = parse_fleet({"name": "two-by-four", "hosts": [{"name": "a", "gpu_count": 4, "memory_mib": 81920},
                                                     {"name": "b", "gpu_count": 4, "memory_mib": 81920}],
                     "endpoints": {"one": {"model": "s", "memory_mib_per_gpu": 1000, "cold_start_s": 20},
                                   "four": {"model": "g", "tensor_parallel": 4, "memory_mib_per_gpu": 1000,
                                            "cold_start_s": 20}}})


AGED_AFTER_S = 600.0  # the mechanism tests below: the gang (released at 1,800 s) has aged by 2,500 s


def gang_starved_jobs() -> list[PlanJob]:
    jobs = [PlanJob(f"s{i}", "one", 2.0, 38.0 * i, 300.0, 2, seq=i) for i in range(int(4 * 3600 / 38))]
    jobs.append(PlanJob("gang", "four", 2.0, 1800.0, 600.0, 2, seq=10 ** 6))
    return sorted(jobs, key=lambda j: (j.release_s, j.seq))


def _gang_wait(rep):
    rec = next(r for r in rep["schedule"]["jobs"] if r["id"] == "gang")
    return rec["start_s"] - rec["submit_s"]


@pytest.mark.parametrize("policy", ["portfolio", "default"])
def test_the_gang_starts_within_the_aging_bound(policy):
    jobs = gang_starved_jobs()
    rep = simulate(jobs, FLEET, policy, restore=False, detail=True, time_limit_s=0.05)
    # the bound (docs/planner.md): aging + the longest remaining service on its group + its transition
    assert _gang_wait(rep) <= DEFAULT_RESERVATION_AFTER_S + 300.0 + 20.0 + 30.0  # + one planning window
    assert rep["sim"]["reserved_points"] > 0
    off = simulate(jobs, FLEET, "portfolio", restore=False, detail=True, reservation_after_s=None)
    assert _gang_wait(off) > 3 * 3600  # the starvation without it (before the fix: the only behaviour)


def test_backfill_only_with_jobs_that_end_before_the_reservation():
    """At t = 2,500 s (the gang aged): every plan start on the reserved group before the
    reservation ends by it; the plan replays through the evaluator."""
    st = fleet_state(FLEET, 2500.0)
    running = {"a": [2600.0, 2650.0, 2700.0, 2750.0], "b": [2620.0, 2680.0, 2720.0, 2790.0]}
    for g in st.gpus:
        st.free_at[g.uuid] = running[g.host][g.index]
        st.resident[g.uuid] = "one"
    batch = [PlanJob("gang", "four", 2.0, 1800.0, 600.0, 2, seq=0)]
    batch += [PlanJob(f"s{i}", "one", 2.0, 2400.0 + i, 300.0 if i % 2 else 40.0, 2, seq=1 + i) for i in range(8)]
    p0 = plan(batch, st, "portfolio")
    assert p0.by_job()["gang"].start_s > 2750.0 + 1.0  # the policy pushes it back
    p, res = enforce(p0, batch, st, AGED_AFTER_S)
    assert len(res) == 1 and res[0].job_id == "gang" and res[0].start_s == pytest.approx(2750.0)
    gang = p.by_job()["gang"]
    assert gang.start_s == pytest.approx(2750.0) and tuple(gang.gpus) == res[0].gpus
    for a in p.assignments:
        if a.job_id != "gang" and set(a.gpus) & set(res[0].gpus) and a.start_s < gang.start_s:
            assert a.end_s <= gang.start_s + 1e-6
    assert evaluate(p, batch, st, check_times=True).objective == pytest.approx(p.objective)
    # not aged yet: the plan as the policy made it
    young = [PlanJob("gang", "four", 2.0, 2400.0, 600.0, 2, seq=0)] + batch[1:]
    q0 = plan(young, st, "portfolio")
    assert enforce(q0, young, st, AGED_AFTER_S) == (q0, [])


def test_a_higher_level_job_is_not_deferred_behind_a_lower_level_reservation():
    """The aged NORMAL gang holds host a's group from 2,750 s; a HIGH job of 300 s that the
    plan starts on GPU a0 at 2,600 s (it ends after the reservation's start) keeps its
    place, and the gang starts when it ends (before: deferred behind the NORMAL gang)."""
    st = fleet_state(FLEET, 2500.0)
    running = {"a": [2600.0, 2650.0, 2700.0, 2750.0], "b": [2620.0, 2680.0, 2720.0, 2790.0]}
    for g in st.gpus:
        st.free_at[g.uuid] = running[g.host][g.index]
        st.resident[g.uuid] = "one"
    batch = [PlanJob("gang", "four", 2.0, 1800.0, 600.0, 2, seq=0), PlanJob("high", "one", 4.0, 2450.0, 300.0, 1, seq=1)]
    p0 = plan(batch, st, "fifo")  # HIGH first, on the first GPU to free: a0 at 2,600 s
    high0 = p0.by_job()["high"]
    assert high0.start_s == pytest.approx(2600.0) and high0.end_s > 2750.0
    p, res = enforce(p0, batch, st, AGED_AFTER_S)
    assert len(res) == 1 and res[0].job_id == "gang" and "high" not in res[0].deferred
    assert p.by_job()["high"].start_s == pytest.approx(2600.0)
    assert p.by_job()["gang"].start_s == pytest.approx(high0.end_s)


def test_live_and_simulator_defaults_agree(monkeypatch):
    """The aging bound and the fast lane: Settings (live, MAKESPAN_* unset), the planner
    modules' defaults and simulate()'s defaults are the same values."""
    import inspect

    from makespan.planner.fast_lane import DEFAULT_LANE_LEVELS, factors
    from makespan.settings import Settings

    monkeypatch.delenv("MAKESPAN_RESERVATION_AFTER_S", raising=False)
    monkeypatch.delenv("MAKESPAN_FAST_LANE", raising=False)
    live = Settings.from_env()
    sim = inspect.signature(simulate).parameters
    assert live.reservation_after_s == Settings().reservation_after_s == DEFAULT_RESERVATION_AFTER_S
    assert sim["reservation_after_s"].default == DEFAULT_RESERVATION_AFTER_S
    assert live.fast_lane_levels == Settings().fast_lane_levels == factors(DEFAULT_LANE_LEVELS)
    assert factors(sim["lane_levels"].default) == factors(DEFAULT_LANE_LEVELS)
