"""Swap/regroup descent between CP-SAT windows: valid plans, never worse, finds a move."""

import time

import pytest

from makespan.planner.cpsat import improve
from makespan.planner.evaluator import evaluate, score
from makespan.planner.greedy import fifo, portfolio
from makespan.planner.list_schedule import list_schedule
from makespan.planner.local import descent
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.synthetic import instance


def test_descent_swaps_a_heavy_short_job_forward():
    st = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], {"m": EndpointModel("m", 1, 1000, 60.0, 5.0)},
                    resident={"g0": "m"})
    batch = [PlanJob("long", "m", 1.0, 0.0, 500.0, 3, seq=0), PlanJob("short", "m", 8.0, 0.0, 10.0, 0, seq=1)]
    start = evaluate(list_schedule("x", batch, st), batch, st)  # long first: 500 + 8·510
    out, moves = descent(start, batch, st, time.perf_counter() + 5.0)
    assert moves == 1 and [a.job_id for a in out.assignments] == ["short", "long"]
    assert score(out) == pytest.approx(8 * 10 + 510)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_descent_never_worse_and_valid(seed):
    batch, st = instance(40, 8, 6, seed=seed, spread_s=120)
    st.free_at[st.gpus[1].uuid] = 300.0
    for start in (fifo(batch, st), portfolio(batch, st)):
        out, _moves = descent(start, batch, st, time.perf_counter() + 5.0)
        again = evaluate(out, batch, st)
        assert again.objective == pytest.approx(out.objective)
        assert score(out) <= score(start) + 1e-6
        assert all(a.start_s >= 300.0 for a in out.assignments if st.gpus[1].uuid in a.gpus)


def test_improver_windows_alone_still_never_worse():
    batch, st = instance(40, 8, 6, seed=2, spread_s=120)
    floor = portfolio(batch, st)
    out = improve(batch, st, floor, time_limit_s=0.3, local=False)
    evaluate(out, batch, st)
    assert out.stats["local_moves"] == 0 and out.stats["windows"] >= 1
    assert score(out) <= score(floor) + 1e-6


def test_improver_with_no_time_left_returns_the_floor_untouched():
    """The improver checks its deadline before every descent pass and window (the limit
    itself is measured in bench/planner_cpsat.py: plan time p95 against the limit)."""
    batch, st = instance(200, 32, 8, seed=3, spread_s=300)
    floor = portfolio(batch, st)
    out = improve(batch, st, floor, time_limit_s=0.0)
    assert out.stats["windows"] == 0 and out.stats["local_moves"] == 0 and out.stats["sweeps"] == 0
    assert score(out) == score(floor)


def test_descent_and_improver_on_the_tardiness_objective():
    batch, st = instance(40, 8, 6, seed=4, spread_s=120)
    batch = [PlanJob(j.id, j.endpoint, j.weight, j.release_s, j.service_s, j.priority,
                     deadline_s=j.release_s + 2 * j.service_s if i % 2 else None, seq=j.seq)
             for i, j in enumerate(batch)]
    start = evaluate(fifo(batch, st), batch, st, objective="weighted_tardiness")
    out, _moves = descent(start, batch, st, time.perf_counter() + 5.0, "weighted_tardiness")
    again = evaluate(out, batch, st, objective="weighted_tardiness")
    assert score(again) == pytest.approx(score(out)) and score(out) <= score(start) + 1e-9
    imp = improve(batch, st, start, time_limit_s=0.2, objective="weighted_tardiness", previous=fifo(batch, st))
    assert score(evaluate(imp, batch, st, objective="weighted_tardiness")) <= score(start) + 1e-9
