"""Random small instances with running jobs (review5)."""
import random

from makespan.planner import preemption_plan as pp
from makespan.planner.evaluator import score
from makespan.planner.model import FleetState, Gpu, RunningJob
from tests.planner.test_preemption_plan import EPS, _job


def instance(seed, deadlines=False, deps=False, transit=True):
    rng = random.Random(seed)
    n = rng.choice([2, 4, 4, 6])
    now = 100.0
    gpus = [Gpu(f"g{i}", "a", i, 80000) for i in range(n)]
    res, free_at, run = {}, {}, {}
    i = 0
    k = 0
    while i < n:
        if rng.random() < 0.2:
            i += 1
            continue
        tp2 = i % 2 == 0 and i + 1 < n and rng.random() < 0.3
        ep = "t2" if tp2 else rng.choice(["m1", "m2"])
        gs = (f"g{i}", f"g{i + 1}") if tp2 else (f"g{i}",)
        i += len(gs)
        svc = rng.uniform(100, 1500)
        start = rng.uniform(-400, 99)
        sstart = start
        if transit and rng.random() < 0.3:
            start = now - rng.uniform(1, 20)
            sstart = start + EPS[ep].cold_start_s
        job = _job(f"r{k}", ep, rng.choice([1, 2, 3, 3]), 0.0, svc, k,
                   deadline_s=(now + rng.uniform(0, 2000)) if deadlines and rng.random() < 0.5 else None)
        k += 1
        end = sstart + svc
        ok = rng.random() > 0.15
        for u in gs:
            res[u] = ep
            free_at[u] = end
            run[u] = RunningJob(job, gs, start, sstart, end, ok)
    state = FleetState(now, gpus, EPS, free_at=free_at, resident=res, set_point={}, running=run)
    batch = [_job(f"C{k}", rng.choice(["m1", "m2", "t2"]), rng.choice([0, 1]), 100.0, rng.uniform(20, 300), 10 + k,
                  deadline_s=(now + rng.uniform(30, 600)) if deadlines and rng.random() < 0.7 else None)
             for k in range(rng.randint(1, 4))]
    for k in range(rng.randint(3, 14)):
        d = ()
        if deps and k and rng.random() < 0.25:
            d = (f"b{rng.randrange(k)}",)
        batch.append(_job(f"b{k}", rng.choice(["m1", "m2", "t2"]), rng.choice([1, 2, 3]), rng.uniform(0, 150),
                          rng.uniform(20, 400), 20 + k, deps=d,
                          deadline_s=(now + rng.uniform(0, 3000)) if deadlines and rng.random() < 0.5 else None))
    return state, batch


def total(p, batch, state, objective):
    """Score of p (with preemptions) on every job it touches plus uncut running jobs at their
    ends, plus the work the cut ones already did (``LOST_WORK_WEIGHT`` × w·(now − start))."""
    cut = {v for x in p.preemptions for v in x.victims}
    ev = pp.evaluate_preemptive(p, batch, state, objective)
    hold = {h.id: h for h in state.running.values()}
    kept = [(h.job, h.end_s) for h in hold.values() if h.id not in cut]
    lost = pp.LOST_WORK_WEIGHT * sum(h.weight * max(0.0, state.now_s - h.start_s) for h in hold.values() if h.id in cut)
    return score(ev) + pp.fixed_score(kept, objective) + lost, ev
