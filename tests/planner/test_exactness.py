"""Exactness: on small instances the planner's best plan equals the optimum found by
exhaustive search in the evaluator; on one GPU without transitions it is Smith's rule."""

import itertools

import pytest

from makespan.planner.api import plan
from makespan.planner.evaluator import evaluate
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.replay import Replay
from makespan.planner.synthetic import instance


def brute_force(batch, state, cost=None):
    """Minimum Σ w(C−r) (or Σ ``cost(job, C)``) over every order × group choice, each job at
    its earliest start (an optimal schedule of a regular objective is such a list schedule)."""
    cost = cost or (lambda j, end: j.weight * (end - j.release_s))
    rep0 = Replay(state)
    cands = {j.id: rep0.groups(state.endpoints[j.endpoint]) for j in batch}
    best = float("inf")
    for order in itertools.permutations(batch):
        for choice in itertools.product(*(cands[j.id] for j in order)):
            rep = Replay(state)
            total = 0.0
            for j, g in zip(order, choice):
                if any(d not in rep.end_of for d in j.deps if d in cands):
                    total = float("inf")
                    break
                a = rep.place(j, g)
                total += cost(j, a.end_s)
                if total >= best:
                    break
            best = min(best, total)
    return best


def small(seed, n_jobs, n_gpus):
    batch, st = instance(n_jobs, n_gpus, models=3, seed=seed, spread_s=100, gang=True)
    return batch, st


@pytest.mark.parametrize("seed", range(4))
def test_planner_reaches_exhaustive_optimum(seed):
    batch, st = small(seed, 5 if seed % 2 else 6, 4 if seed % 2 else 2)
    opt = brute_force(batch, st)
    got = plan(batch, st, "default")
    assert evaluate(got, batch, st).objective == pytest.approx(got.objective)
    assert got.objective == pytest.approx(opt, rel=1e-9)


def test_smiths_rule_on_one_gpu_without_transitions():
    gpus = [Gpu("g0", "h", 0, 1000)]
    eps = {"e": EndpointModel("e", 1, 10, 30.0, 1.0)}
    st = FleetState(0.0, gpus, eps, resident={"g0": "e"})
    batch = [PlanJob(f"j{i}", "e", w, 0.0, p, seq=i) for i, (w, p) in enumerate([(1, 7), (8, 3), (2, 2), (4, 9), (1, 1)])]
    smith = sorted(batch, key=lambda j: j.service_s / j.weight)
    t = total = 0.0
    for j in smith:
        t += j.service_s
        total += j.weight * t
    for policy in ("wspt", "portfolio", "default"):
        assert plan(batch, st, policy).objective == pytest.approx(total)
    assert brute_force(batch, st) == pytest.approx(total)


@pytest.mark.parametrize("seed", range(3))
def test_exact_with_identical_hosts_reaches_the_optimum(seed):
    """Host symmetry in planner/exact.py: two identical idle hosts are branched on once."""
    import dataclasses
    batch, st = small(seed, 5, 4)
    gpus = [Gpu(f"h{i // 2}-g{i % 2}", f"h{i // 2}", i % 2, 80_000) for i in range(4)]
    st = dataclasses.replace(st, gpus=gpus, resident={}, free_at={})
    assert plan(batch, st, "default").objective == pytest.approx(brute_force(batch, st), rel=1e-9)


def test_exact_stops_at_its_time_limit_with_the_incumbent():
    from makespan.planner.exact import exact
    from makespan.planner.greedy import portfolio
    batch, st = small(0, 6, 4)
    floor = portfolio(batch, st)
    out = exact(batch, st, floor, time_limit_s=0.0)
    assert out.stats["exact"] == 0.0
    assert out.objective <= floor.objective + 1e-9
