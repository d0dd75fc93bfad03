import math
import random
from dataclasses import replace

import pytest

from makespan.planner.evaluator import evaluate, evaluate_built
from makespan.planner.greedy import member_builders, portfolio
from makespan.planner.synthetic import instance


def _case(seed):
    rng = random.Random(seed)
    batch, st = instance(rng.choice((5, 12, 30)), rng.choice((4, 8)), models=rng.choice((2, 3, 6)), seed=seed,
                         spread_s=rng.choice((0.0, 300.0)), gang=seed % 3 != 0, wake=seed % 2 == 0)
    now = rng.choice((0.0, 50.0))
    st.now_s = now
    uu = [g.uuid for g in st.gpus]
    eps = sorted(st.endpoints)
    for u in uu:  # running work, partial TP residents, sleeping models
        if rng.random() < 0.5:
            st.free_at[u] = now + rng.choice((0.0, rng.uniform(0, 400)))
        if rng.random() < 0.5:
            st.resident[u] = rng.choice(eps + [None])
        if rng.random() < 0.3:
            st.asleep[u] = frozenset(rng.sample(eps, 1))
    ext = {f"x{k}": now + rng.uniform(-10, 300) for k in range(3)}
    st.end_of = dict(ext)
    out = []
    for i, j in enumerate(batch):
        deps = []
        if i and rng.random() < 0.3:
            deps.append(batch[rng.randrange(i)].id)
        if rng.random() < 0.2:
            deps.append(rng.choice(list(ext)))
        svc = 0.0 if rng.random() < 0.15 else j.service_s
        out.append(replace(j, deps=tuple(deps), service_s=svc, release_s=j.release_s + rng.choice((0.0, now))))
    if seed % 2:
        w = [rng.random() for _ in eps]
        st.demand_share = {e: x / sum(w) for e, x in zip(eps, w)}
        st.demand = {e: rng.choice((1.0, 8.0)) for e in eps}
    elif seed % 3 == 0:
        st.demand = {e: rng.choice((0.0, 1.0, 8.0)) for e in eps}
    return out, st


def _both_scores(batch, st):
    """(member name, evaluate_built's plan, evaluate's plan) for every portfolio member
    that builds a plan on ``st``."""
    for name, build in member_builders(batch, st).items():
        built = build(bound=math.inf)
        if built is not None:
            yield (name, evaluate_built(built[0], built[1], batch, st, name),
                   evaluate(built[0], batch, st, name, check_times=False))


@pytest.mark.parametrize("seed", range(150))
def test_evaluate_built_equals_evaluate_on_odd_states(seed):
    batch, st = _case(seed)
    for name, fast, full in _both_scores(batch, st):
        assert (fast.objective, fast.stats) == (full.objective, full.stats), (seed, name)
        assert [vars(a) for a in fast.assignments] == [vars(a) for a in full.assignments], (seed, name)
    portfolio(batch, st)


def test_evaluate_built_equals_evaluate_with_set_point_weight():
    """The set-point term (FleetState.set_point_weight > 0) is the same in both: set points
    on the GPUs' TP-1 residents and on some aligned group per endpoint (TP > 1 instances,
    resident or absent at planning time)."""
    weighed = 0
    for seed in range(60):
        batch, st = _case(seed)
        rng = random.Random(1000 + seed)
        sp = {u: e for u, e in st.resident.items() if e is not None and st.endpoints[e].tp == 1}
        for e, ep in st.endpoints.items():
            gs = [g for g in st.groups(ep.tp, ep.memory_mib) if not set(g) & set(sp)]
            if gs and rng.random() < 0.5:
                g = rng.choice(gs)
                sp.update({u: e for u in g})
                if rng.random() < 0.5:
                    st.resident.update({u: e for u in g})
        st.set_point = sp
        st.set_point_weight = rng.choice((0.1, 1.0, 25.0))
        for name, fast, full in _both_scores(batch, st):
            assert (fast.objective, fast.stats) == (full.objective, full.stats), (seed, name)
            assert full.stats["set_point_cost"] == st.set_point_weight * full.stats["set_point_absent_gpu_s"]
            assert full.stats["score"] == pytest.approx(full.objective + full.stats["future_cost"]
                                                        + full.stats["set_point_cost"], rel=1e-12)
            weighed += full.stats["set_point_absent_gpu_s"] > 0
        portfolio(batch, st)
    assert weighed > 100  # the cases do displace set points
