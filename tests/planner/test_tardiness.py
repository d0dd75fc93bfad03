"""Weighted tardiness on one machine: equals exhaustive search on small instances."""

import itertools
import math
import random

import pytest

from makespan.errors import PlannerError
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.tardiness import solve_single_machine, tardiness_plan, weighted_tardiness


@pytest.mark.parametrize("seed", range(4))
def test_equals_brute_force(seed):
    rng = random.Random(seed)
    n = 7
    p = [rng.randint(1, 30) for _ in range(n)]
    w = [rng.randint(1, 10) for _ in range(n)]
    d = [rng.randint(0, sum(p) // 2) for _ in range(n)]
    opt = min(weighted_tardiness(o, p, w, d) for o in itertools.permutations(range(n)))
    r = solve_single_machine(p, w, d, time_limit_s=2.0)
    assert r.value == opt
    assert weighted_tardiness(r.order, p, w, d) == r.value
    assert sorted(r.order) == list(range(n))


def test_no_deadline_never_counts():
    r = solve_single_machine([5, 5], [1, 1], [math.inf, 0])
    assert r.value == 5 and r.order == [1, 0]  # the job with a deadline first; the other is never late


def test_plan_on_one_gpu():
    eps = {"a": EndpointModel("a", 1, 1000, 10.0, 2.0), "b": EndpointModel("b", 1, 1000, 5.0, 3.0)}
    st = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], eps, resident={"g0": "b"})
    batch = [PlanJob("x", "a", 1.0, 0.0, 20.0, deadline_s=100.0), PlanJob("y", "a", 5.0, 0.0, 10.0, deadline_s=25.0)]
    p = tardiness_plan(batch, st)
    assert [a.job_id for a in p.assignments] == ["y", "x"]
    assert p.assignments[0].load == "cold_start" and p.assignments[0].evicts == ("b",)
    assert p.assignments[0].end_s == 3.0 + 10.0 + 10.0  # evict b, cold start a, serve y
    assert p.objective == 0.0
    with pytest.raises(PlannerError):
        tardiness_plan(batch, FleetState(0.0, [Gpu("g0", "h", 0, 1), Gpu("g1", "h", 1, 1)], eps))
