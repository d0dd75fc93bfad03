"""Seeded synthetic batches for tests and benchmarks (not trace data).

:func:`instance` builds a fleet of ``gpus`` GPUs on hosts of 8 (or fewer), ``models``
endpoints with TP 1/2/4 (mostly 1), cold starts 30–240 s, evicts 2–10 s, and a batch of
``jobs`` jobs with service times 10–600 s (log-uniform), priorities 10/20/40/30 %,
releases spread over ``spread_s``; half the GPUs start holding some endpoint.
"""

from __future__ import annotations

import math
import random

from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob

WEIGHTS = (8.0, 4.0, 2.0, 1.0)


def instance(jobs: int, gpus: int, models: int = 6, seed: int = 0, spread_s: float = 0.0,
             gang: bool = True, wake: bool = False) -> tuple[list[PlanJob], FleetState]:
    rng = random.Random(seed)
    per_host = min(8, gpus)
    fleet = [Gpu(f"h{i // per_host}-g{i % per_host}", f"h{i // per_host}", i % per_host, 80_000)
             for i in range(gpus)]
    eps: dict[str, EndpointModel] = {}
    for m in range(models):
        tp = rng.choice((1, 1, 1, 2, 4)) if gang else 1
        tp = min(tp, per_host)
        eps[f"m{m}"] = EndpointModel(f"m{m}", tp, 20_000, round(rng.uniform(30, 240), 1),
                                     round(rng.uniform(2, 10), 1),
                                     wake_s=round(rng.uniform(3, 15), 1) if wake and rng.random() < 0.5 else None)
    resident: dict[str, str | None] = {}
    names = sorted(eps)
    for g in fleet:
        if rng.random() < 0.5:
            e = rng.choice([n for n in names if eps[n].tp == 1] or names)
            if eps[e].tp == 1:
                resident[g.uuid] = e
    batch = []
    for i in range(jobs):
        prio = rng.choices(range(4), weights=(10, 20, 40, 30))[0]
        batch.append(PlanJob(f"j{i}", rng.choice(names), WEIGHTS[prio], round(rng.uniform(0, spread_s), 1),
                             round(math.exp(rng.uniform(math.log(10), math.log(600))), 1), prio, seq=i))
    state = FleetState(0.0, fleet, eps, resident=resident)
    return batch, state
