"""The pruned portfolio (best-first construction with a lower bound) returns the plan the
full portfolio would: the best of every member by score, ties to the first member."""

import math
import pickle
import random
from dataclasses import replace

import pytest

from makespan.planner.evaluator import score
from makespan.planner.greedy import MEMBERS, construct, members, portfolio
from makespan.planner.list_schedule import wspt_order
from makespan.planner.model import FleetState, Gpu
from makespan.planner.synthetic import instance


def _cases():
    for seed in range(12):
        rng = random.Random(seed)
        batch, st = instance(rng.choice((10, 40, 90)), rng.choice((4, 8, 16)), models=rng.choice((3, 6)),
                             seed=seed, spread_s=rng.choice((0.0, 300.0)), gang=seed % 3 != 0, wake=seed % 2 == 0)
        if seed % 2:
            eps = sorted(st.endpoints)
            w = [rng.random() for _ in eps]
            st.demand_share = {e: x / sum(w) for e, x in zip(eps, w)}
            st.demand = {e: rng.choice((1.0, 8.0)) for e in eps}
        if seed % 4 == 3:  # dependencies: each job may wait for up to two earlier ones
            batch = [replace(j, deps=tuple(batch[k].id for k in rng.sample(range(i), min(i, rng.choice((0, 1, 2))))))
                     for i, j in enumerate(batch)]
        yield seed, batch, st


def _key(p):
    return [(a.job_id, a.gpus, a.start_s, a.end_s, a.load) for a in p.assignments]


@pytest.mark.parametrize("seed,batch,st", list(_cases()))
def test_pruned_portfolio_is_the_best_member(seed, batch, st):
    plans = members(batch, st)
    best = min(plans, key=lambda p: (score(p), MEMBERS.index(p.policy)))
    got = portfolio(batch, st)
    assert _key(got) == _key(best)
    assert got.stats["member"] == MEMBERS.index(best.policy)
    assert score(got) == score(best)


@pytest.mark.parametrize("seed,batch,st", list(_cases())[:6])
def test_prune_bound_never_exceeds_the_final_score(seed, batch, st):
    p = {m.policy: m for m in members(batch, st)}["ta-wspt"]
    order = wspt_order(batch, st.endpoints)
    # the lower bound is valid: a bound equal to the plan's own score never stops it ...
    again = construct("ta-wspt", order, st, "aware", True, 1.0, bound=score(p))
    assert again is not None and sorted(a.job_id for a in again) == sorted(a.job_id for a in p.assignments)
    # ... and a bound below its weighted completion stops it
    assert construct("ta-wspt", order, st, "aware", True, 1.0, bound=p.objective * (1 - 1e-6)) is None
    assert construct("ta-wspt", order, st, "aware", True, 1.0, bound=math.inf) is not None


def test_groups_are_cached_per_gpu_list():
    _, st = instance(4, 8, seed=1)
    first = st.groups(2, 0)
    first.append(("x",))  # the caller's copy: the cache is not touched
    assert st.groups(2, 0) == first[:-1]
    st.gpus = [Gpu(f"n{i}", "h9", i, 80_000) for i in range(4)]  # a new list is a new fleet
    assert st.groups(2, 0) == [("n0", "n1"), ("n2", "n3")]
    assert FleetState(0.0, st.gpus, st.endpoints) == FleetState(0.0, st.gpus, st.endpoints)


def test_pickled_state_leaves_its_groups_cache_behind():
    """The live improver's child gets the state pickled: the cache (keyed by the id of
    the GPU list, meaningless in another process) stays behind; the rest crosses."""
    _, st = instance(4, 8, seed=1)
    st.groups(2, 0)
    again = pickle.loads(pickle.dumps(st))
    assert again == st and again._groups_cache == {} and st._groups_cache
    assert again.groups(2, 0) == st.groups(2, 0)


@pytest.mark.parametrize("seed,batch,st", list(_cases()))
def test_member_scored_from_its_replay_equals_a_fresh_evaluation(seed, batch, st):
    """``evaluate_built`` (what the portfolio scores members with) gives, field by field,
    the plan a fresh ``evaluate(..., check_times=False)`` gives."""
    from makespan.planner.evaluator import evaluate, evaluate_built
    from makespan.planner.greedy import member_builders

    for name, build in member_builders(batch, st).items():
        built = build(bound=math.inf)
        if built is None:
            continue
        fast = evaluate_built(built[0], built[1], batch, st, name)
        full = evaluate(built[0], batch, st, name, check_times=False)
        assert (fast.policy, fast.objective, fast.stats, fast.restores) == \
            (full.policy, full.objective, full.stats, full.restores), (seed, name)
        assert [vars(a) for a in fast.assignments] == [vars(a) for a in full.assignments], (seed, name)


def test_evaluate_built_rejects_a_missing_job():
    from makespan.planner.evaluator import InfeasiblePlan, evaluate_built
    from makespan.planner.greedy import construct_built
    from makespan.planner.replay import Replay

    batch, st = instance(12, 4, seed=1)
    asg, rep = construct_built(wspt_order(batch, st.endpoints), st, "completion", False, 1.0, 1.0, 0.0, math.inf)
    assert isinstance(rep, Replay)
    with pytest.raises(InfeasiblePlan):
        evaluate_built(asg[:-1], rep, batch, st, "wspt")
