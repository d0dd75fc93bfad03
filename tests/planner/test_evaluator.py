"""The evaluator replays plans exactly and rejects infeasible ones with the reason."""

import dataclasses

import pytest

from makespan.planner.api import POLICY_REGISTRY, plan
from makespan.planner.evaluator import InfeasiblePlan, evaluate
from makespan.planner.model import Assignment, EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.synthetic import instance


def _state():
    gpus = [Gpu(f"h0-g{i}", "h0", i, 80_000) for i in range(4)]
    eps = {"a": EndpointModel("a", 1, 1000, 60.0, 5.0),
           "b": EndpointModel("b", 2, 1000, 100.0, 10.0, wake_s=8.0),
           "big": EndpointModel("big", 1, 90_000, 10.0, 1.0)}
    return FleetState(0.0, gpus, eps, resident={"h0-g0": "a", "h0-g2": "b", "h0-g3": "b"})


def test_replay_computes_transitions_and_sleep():
    st = _state()
    jobs = [PlanJob("x", "a", 2.0, 0.0, 10.0), PlanJob("y", "a", 1.0, 0.0, 10.0, seq=1),
            PlanJob("z", "b", 4.0, 0.0, 5.0, seq=2)]
    p = [Assignment("x", ("h0-g0",), 0.0, 0.0, 10.0),  # warm
         Assignment("y", ("h0-g2",), 0.0, 70.0, 80.0, ("b",), "cold_start"),  # evict b (10) + cold a (60)
         Assignment("z", ("h0-g2", "h0-g3"), 80.0, 98.0, 103.0, ("a", "b"), "wake")]  # b asleep on g2 only? no
    with pytest.raises(InfeasiblePlan, match="z: stated"):
        evaluate(p, jobs, st)
    # b slept on g2 but is still resident on g3: the group is not all-asleep, so a cold start.
    p[2] = Assignment("z", ("h0-g2", "h0-g3"), 80.0, 190.0, 195.0, ("a", "b"), "cold_start")
    out = evaluate(p, jobs, st)
    assert out.objective == 2 * 10 + 1 * 80 + 4 * 195
    assert out.stats["cold_starts"] == 2


@pytest.mark.parametrize("bad, reason", [
    (dict(gpus=("h0-g1", "h0-g2")), "not an aligned"),
    (dict(start_s=-1.0), "before it is ready"),
    (dict(job_id="nope"), "not in the batch"),
])
def test_rejects_infeasible(bad, reason):
    st = _state()
    jobs = [PlanJob("z", "b", 4.0, 0.0, 5.0)]
    good = Assignment("z", ("h0-g2", "h0-g3"), 0.0, 0.0, 5.0)
    assert evaluate([good], jobs, st).objective == 20
    with pytest.raises(InfeasiblePlan, match=reason):
        evaluate([dataclasses.replace(good, **bad)], jobs, st)


def test_rejects_overlap_memory_missing_and_precedence():
    st = _state()
    jobs = [PlanJob("x", "a", 1.0, 0.0, 10.0), PlanJob("y", "a", 1.0, 0.0, 10.0, deps=("x",))]
    x = Assignment("x", ("h0-g0",), 0.0, 0.0, 10.0)
    with pytest.raises(InfeasiblePlan, match="busy until 10"):
        evaluate([x, Assignment("y", ("h0-g0",), 5.0, 5.0, 15.0)],
                 [jobs[0], dataclasses.replace(jobs[1], deps=())], st)
    with pytest.raises(InfeasiblePlan, match="ready at 10"):
        evaluate([x, Assignment("y", ("h0-g1",), 0.0, 60.0, 70.0, (), "cold_start")], jobs, st)
    with pytest.raises(InfeasiblePlan, match="not placed"):
        evaluate([x], jobs, st)
    with pytest.raises(InfeasiblePlan, match="MiB"):
        evaluate([Assignment("g", ("h0-g1",), 0.0, 10.0, 11.0, (), "cold_start")],
                 [PlanJob("g", "big", 1.0, 0.0, 1.0)], st)
    st.free_at["h0-g1"] = 50.0  # running work is never moved
    with pytest.raises(InfeasiblePlan, match="busy until 50"):
        evaluate([Assignment("g", ("h0-g1",), 0.0, 60.0, 70.0, (), "cold_start")],
                 [PlanJob("g", "a", 1.0, 0.0, 10.0)], st)


@pytest.mark.parametrize("policy", sorted(POLICY_REGISTRY))
def test_every_policy_returns_an_evaluated_complete_plan(policy):
    batch, st = instance(30, 8, 5, seed=3, spread_s=200)
    p = plan(batch, st, policy)
    again = evaluate(p, batch, st, objective=POLICY_REGISTRY[policy].objective)
    assert again.objective == pytest.approx(p.objective)
    assert len(p.assignments) == len(batch)


def test_transition_aware_beats_fifo_on_transition_heavy_batch():
    wins = 0
    for seed in range(3):
        batch, st = instance(120, 16, 8, seed=seed, spread_s=600)
        wins += plan(batch, st, "portfolio").objective < 0.8 * plan(batch, st, "fifo").objective
    assert wins == 3
