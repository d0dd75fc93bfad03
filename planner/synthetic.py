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


# The swap-heavy scenario (issue 20 point 6) ---------------------------------------------

SWAP_PATTERN = "ABAACABC"
"""The interleaved request queue llama-swap's maintainer describes (llama-swap#612: "a
request queue that looks like A B A A C A B C", where FIFO swapping thrashes)."""
SWAP_MODELS = "ABCDE"


def swap_heavy_pattern(rounds: int) -> str:
    """The request sequence of :func:`swap_heavy`: ``rounds`` repeats of
    :data:`SWAP_PATTERN`, the rare models D and E inserted after every second and third
    repeat (a few rare requests that each cost a load, as Darkbloom#789 counts: 1.13 % of
    the requests causing 71 % of the loads)."""
    out = []
    for r in range(rounds):
        out.append(SWAP_PATTERN)
        if r % 2 == 1:
            out.append("D")
        if r % 3 == 2:
            out.append("E")
    return "".join(out)


def swap_heavy_fleet(sleepy: str = SWAP_MODELS, level2: bool = True, host_memory_mib: int | None = 65_536,
                     gpus: int = 3) -> dict:
    """The fleet file (dict) of :func:`swap_heavy`: one host with ``gpus`` GPU slots of 80 GiB
    (one model each: 44–52 GiB per model), five models A–E with cold starts 35–75 s;
    the models in ``sleepy`` have a sleep mode (level-1 wake 2–4 s, level 2 as well when
    ``level2``: 6–10 s); ``host_memory_mib``: the host's RAM for sleepers (None: no budget;
    64 GiB holds one level-1 sleeper)."""
    host: dict = {"name": "h0", "gpu_count": gpus, "memory_mib": 81920}
    if host_memory_mib is not None:
        host["host_memory_mib"] = host_memory_mib
    endpoints = {}
    for i, name in enumerate(SWAP_MODELS):
        spec: dict = {"model": f"swap/{name}", "memory_mib_per_gpu": 44_000 + 2_000 * i,
                      "cold_start_s": 35.0 + 10.0 * i, "evict_s": 3.0}
        if name in sleepy:
            spec["wake_s"] = 2.0 + 0.5 * i
            if level2:
                spec["wake_level2_s"] = 6.0 + i
        endpoints[name] = spec
    return {"name": "swap-heavy", "hosts": [host], "endpoints": endpoints}


def swap_heavy(rounds: int = 12, seed: int = 0, gap_s: float = 6.0, service_s: tuple[float, float] = (5.0, 30.0)
               ) -> list[PlanJob]:
    """The swap-heavy scenario's jobs (issue 20 point 6): the requests of
    :func:`swap_heavy_pattern` arriving one every ``gap_s`` s on average (exponential
    gaps, seeded), service times uniform in ``service_s`` s, priorities NORMAL (A, the
    busy model) and LOW, in sequence order. Pair it with :func:`swap_heavy_fleet`."""
    rng = random.Random(seed)
    t_s, jobs = 0.0, []
    for i, name in enumerate(swap_heavy_pattern(rounds)):
        prio = 2 if name == "A" else 3
        jobs.append(PlanJob(f"s{i}", name, WEIGHTS[prio], round(t_s, 3), round(rng.uniform(*service_s), 3), prio, seq=i))
        t_s += rng.expovariate(1.0 / gap_s)
    return jobs
