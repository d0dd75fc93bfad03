"""Prewarm by wake (issue 20 point 5): the rule (makespan.planner.prewarm) and the
simulator's use of it."""

from __future__ import annotations

import pytest

from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.prewarm import Prewarm, prewarm_wakes
from makespan.planner.simulator import simulate

COLD_S, WAKE_S = 60.0, 4.0


def _endpoint(name: str, sleepy: bool = True) -> EndpointModel:
    options = ((1, WAKE_S, 20_000),) if sleepy else ()
    return EndpointModel(name, 1, 20_000, COLD_S, 3.0, wake_s=WAKE_S if sleepy else None, asleep_gpu_mib=500,
                         asleep_ram_mib=20_000 if sleepy else 0, sleep_options=options)


def _state(**changes) -> FleetState:
    """Two GPUs: ``a`` sleeps under ``b`` on g0, g1 holds ``c`` (no sleep mode); recent
    demand: a 0.6, b 0.3, c 0.1."""
    eps = {"a": _endpoint("a"), "b": _endpoint("b"), "c": _endpoint("c", sleepy=False)}
    fields = {"resident": {"g0": "b", "g1": "c"}, "asleep": {"g0": frozenset({"a"})},
              "demand_share": {"a": 0.6, "b": 0.3, "c": 0.1}, **changes}
    return FleetState(100.0, [Gpu("g0", "h", 0, 80_000), Gpu("g1", "h", 1, 80_000)], eps, **fields)


def test_a_sleeper_in_more_demand_than_the_idle_resident_is_woken():
    assert prewarm_wakes(_state(), set(), set(), 130.0) == [Prewarm("a", ("g0",), 100.0)]


def test_a_group_that_frees_before_the_next_planning_point_is_woken_when_it_frees():
    state = _state(free_at={"g0": 120.0})
    assert prewarm_wakes(state, set(), set(), 130.0) == [Prewarm("a", ("g0",), 120.0)]
    assert prewarm_wakes(state, set(), set(), 120.0) == []  # frees only at the next point


@pytest.mark.parametrize("why", ["planned", "queued", "queued resident", "resident elsewhere", "busier resident",
                                 "resident without sleep mode", "set point", "no demand"])
def test_no_prewarm(why):
    state, planned, queued = _state(), set(), set()
    if why == "planned":
        planned = {"g0"}  # a job or restore of the plan goes there
    elif why == "queued":
        queued = {"a"}  # the plan places a's jobs itself
    elif why == "queued resident":
        queued = {"b"}
    elif why == "resident elsewhere":
        state = _state(resident={"g0": "b", "g1": "a"})
    elif why == "busier resident":
        state = _state(demand_share={"a": 0.3, "b": 0.6})
    elif why == "resident without sleep mode":
        state = _state(resident={"g0": "c", "g1": None})  # c would be stopped: not cheap to undo
    elif why == "set point":
        state = _state(set_point={"g0": "b"})  # the set-point restore would undo it
    elif why == "no demand":
        state = _state(demand_share={})
    assert prewarm_wakes(state, planned, queued, 130.0) == []


def _sim_case() -> tuple[list[PlanJob], FleetState]:
    """One GPU: two jobs of ``a``, then ``b`` displaces it (a sleeps), then ``a`` again at
    1000 s, long after the GPU went idle."""
    eps = {"a": _endpoint("a"), "b": _endpoint("b")}
    state = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps)
    jobs = [PlanJob("a1", "a", 2.0, 0.0, 10.0, 2, seq=0), PlanJob("a2", "a", 2.0, 5.0, 10.0, 2, seq=1),
            PlanJob("b1", "b", 2.0, 100.0, 10.0, 2, seq=2), PlanJob("a3", "a", 2.0, 1000.0, 10.0, 2, seq=3)]
    return jobs, state


def test_the_simulator_prewarms_an_idle_gpu_and_the_next_job_finds_it_warm():
    jobs, state = _sim_case()
    off = simulate(jobs, state, "portfolio", 0, restore=False, detail=True)
    on = simulate(jobs, state, "portfolio", 0, restore=False, detail=True, prewarm=True)
    load = {rep["sim"]["prewarm"]: {j["id"]: j["load"] for j in rep["schedule"]["jobs"]} for rep in (off, on)}
    assert load[False]["a3"] == "wake" and load[True]["a3"] == "warm"
    assert off["transitions"]["prewarm"] == 0 and on["transitions"]["prewarm"] == 1
    # a3 no longer waits for the evict of b (3 s) and its wake
    assert on["weighted_completion_s"] == pytest.approx(off["weighted_completion_s"] - 2.0 * (3.0 + WAKE_S))
    # the same sleep of b and wake of a, moved ahead of a3: counted in the transition GPU-s
    assert on["transition_gpu_s"] == off["transition_gpu_s"]
