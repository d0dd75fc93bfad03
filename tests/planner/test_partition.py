"""Partition member: residency first, WSPT inside; complete and feasible plans."""

from makespan.planner.evaluator import evaluate
from makespan.planner.greedy import portfolio
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.partition import allocate, partition
from makespan.planner.synthetic import instance


def test_allocation_follows_work_and_keeps_residents():
    gpus = [Gpu(f"g{i}", "h", i, 80_000) for i in range(4)]
    eps = {"a": EndpointModel("a", 1, 1000, 100.0, 5.0), "b": EndpointModel("b", 1, 1000, 100.0, 5.0)}
    st = FleetState(0.0, gpus, eps, resident={"g3": "a"})
    batch = [PlanJob(f"a{i}", "a", 1.0, 0.0, 30.0, seq=i) for i in range(6)] + \
            [PlanJob(f"b{i}", "b", 1.0, 0.0, 30.0, seq=10 + i) for i in range(2)]
    alloc = allocate(batch, st)
    assert sorted(len(v) for v in alloc.values()) == [1, 3]  # 180 : 60 GPU-s of work on 4 GPUs
    assert ("g3",) in alloc["a"]
    plan = evaluate(partition(batch, st), batch, st)
    assert plan.stats["cold_starts"] == 3  # a on two more GPUs, b once; never reloaded


def test_skipped_when_the_fleet_cannot_hold_every_model():
    gpus = [Gpu("g0", "h", 0, 80_000)]
    eps = {"a": EndpointModel("a", 1, 1000, 10.0, 1.0), "b": EndpointModel("b", 1, 1000, 10.0, 1.0)}
    st = FleetState(0.0, gpus, eps)
    batch = [PlanJob("x", "a", 1.0, 0.0, 5.0), PlanJob("y", "b", 1.0, 0.0, 5.0, seq=1)]
    assert partition(batch, st) is None
    assert len(portfolio(batch, st).assignments) == 2


def test_partition_plans_are_feasible_with_gangs():
    for seed in range(5):
        batch, st = instance(40, 16, models=4, seed=seed, spread_s=300, gang=True)
        out = partition(batch, st)
        if out is not None:
            evaluate(out, batch, st)  # raises InfeasiblePlan otherwise


def test_spill_never_takes_a_group_too_small_for_the_job():
    """A job spills only onto groups with the memory its endpoint needs: here the big
    endpoint's third job would complete earliest on the small endpoint's 40 GB GPU (it
    did before the check, and the portfolio's final replay raised InfeasiblePlan)."""
    gpus = [Gpu("a0", "a", 0, 40_000), Gpu("a1", "a", 1, 40_000), Gpu("b0", "b", 0, 80_000), Gpu("b1", "b", 1, 80_000)]
    eps = {"small": EndpointModel("small", 1, 20_000, 30.0, 2.0), "big": EndpointModel("big", 1, 60_000, 30.0, 2.0)}
    st = FleetState(0.0, gpus, eps)
    batch = [PlanJob(f"b{i}", "big", 1.0, 0.0, 100.0, seq=i) for i in range(3)] + \
        [PlanJob("s", "small", 1.0, 0.0, 1.0, seq=3)]
    assert allocate(batch, st) == {"big": [("b0",), ("b1",)], "small": [("a0",)]}
    out = partition(batch, st, spill=True)
    assert out is not None
    assert {a.job_id: a.gpus for a in out}["b2"] in (("b0",), ("b1",))
    evaluate(out, batch, st)  # every group valid for its job
    evaluate(portfolio(batch, st).assignments, batch, st)
