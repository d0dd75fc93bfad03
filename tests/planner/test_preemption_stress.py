"""review5: improve/plan with preemption on states with sleep mode, demand (future
cost), TP-2/TP-4 holders, committed work after a holder, deps on holders."""
import random

import pytest
from ortools.sat.python import cp_model

from makespan.planner import window_model
from makespan.planner.api import plan
from makespan.planner.cpsat import improve
from makespan.planner.greedy import portfolio
from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob, RunningJob
from tests.planner.preemption_gen import total
from tests.planner.test_window_hint_feasible import _Rec
from tests.planner.test_preemption_invariants import _check

EPS = {"m1": EndpointModel("m1", 1, 1000, 30.0, 5.0, wake_s=4.0), "m2": EndpointModel("m2", 1, 1000, 60.0, 5.0),
       "t2": EndpointModel("t2", 2, 1000, 40.0, 5.0, wake_s=6.0), "q4": EndpointModel("q4", 4, 1000, 90.0, 8.0)}
W = {0: 8.0, 1: 4.0, 2: 2.0, 3: 1.0}


def _inst(seed):
    rng = random.Random(seed)
    n = rng.choice([4, 8])
    now = 100.0
    gpus = [Gpu(f"g{i}", "a" if i < 4 else "b", i % 4, 80000) for i in range(n)]
    res, asleep, free_at, run = {}, {}, {}, {}
    i = k = 0
    holders = []
    while i < n:
        r = rng.random()
        if r < 0.15:
            res[f"g{i}"] = rng.choice([None, "m1", "m2"])
            i += 1
            continue
        size = 4 if (i % 4 == 0 and r > 0.9) else 2 if (i % 2 == 0 and r > 0.65) else 1
        ep = {1: rng.choice(["m1", "m2"]), 2: "t2", 4: "q4"}[size]
        gs = tuple(f"g{x}" for x in range(i, i + size))
        i += size
        svc = rng.uniform(100, 1500)
        start = rng.uniform(-400, 99)
        sstart = start if rng.random() < 0.7 else start + EPS[ep].cold_start_s
        lvl = rng.choice([1, 2, 3, 3])
        job = PlanJob(f"r{k}", ep, W[lvl], 0.0, svc, lvl, (), None, k)
        k += 1
        end = sstart + svc
        later = rng.random() < 0.1
        for u in gs:
            res[u] = ep
            free_at[u] = end + (50.0 if later else 0.0)
            run[u] = RunningJob(job, gs, start, sstart, end, rng.random() > 0.1)
            if rng.random() < 0.3:
                asleep[u] = frozenset({"m1"} if ep != "m1" else {"t2"})
        holders.append(job.id)
    st = FleetState(now, gpus, EPS, free_at=free_at, resident=res, set_point={}, running=run, asleep=asleep)
    if rng.random() < 0.5:
        st.demand = {e: rng.choice([0.0, 1.0, 4.0]) for e in EPS}
    batch = []
    for c in range(rng.randint(1, 4)):
        batch.append(PlanJob(f"C{c}", rng.choice(["m1", "m2", "t2", "q4"]), W[0 if c % 2 else 1], now,
                             rng.uniform(20, 300), 0 if c % 2 else 1, (), None, 10 + c))
    for b in range(rng.randint(6, 16)):
        lvl = rng.choice([1, 2, 3])
        deps = (rng.choice(holders),) if holders and rng.random() < 0.1 else ()
        batch.append(PlanJob(f"b{b}", rng.choice(["m1", "m2", "t2", "m1"]), W[lvl], rng.uniform(0, 150),
                             rng.uniform(20, 400), lvl, deps, None, 20 + b))
    st.end_of = {h: run[next(u for u in run if run[u].id == h)].end_s for h in holders}
    return st, batch


@pytest.mark.parametrize("seed", range(20))
def test_improve_with_preemption_on_odd_states(monkeypatch, seed):
    st, batch = _inst(seed)
    monkeypatch.setattr(window_model.cp_model, "CpSolver", _Rec)
    _Rec.log = []
    g = portfolio(batch, st)
    p = improve(batch, st, g, time_limit_s=0.3, seed=seed, verify_hint=True, preemption=True)
    bad = [c for c in _Rec.log if len(c) == 2 and c[0] in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID)]
    assert not bad
    t, _ = total(p, batch, st, "weighted_completion")
    t0, _ = total(g, batch, st, "weighted_completion")
    assert t <= t0 + 1e-6
    _check(p, batch, st, "weighted_completion")
    q = plan(batch, st, "cpsat", preemption=True, time_limit_s=0.3)
    f = plan(batch, st, "portfolio", preemption=True)
    assert _check(q, batch, st, "weighted_completion") <= _check(f, batch, st, "weighted_completion") + 1e-6
