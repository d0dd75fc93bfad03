"""Shared fleet and trace windows for the planner benchmarks.

Fleet: 8 endpoints (TP 1/2/4, cold starts 45–240 s, one with a sleep mode), hosts of 8
GPUs, a few endpoints at the set point.

Window rule (transition-heavy windows, issue 3; computed from the trace alone — the same
for every policy and seed):
    1. candidates are ``n`` consecutive rows starting at rows 0, n, 2n, … of a trace,
       mapped with seed 0 (TP comes from the row's GPU count, so the test below does
       not depend on the seed);
    2. service times are winsorized at the window's 95th percentile (ITP and Alibaba
       are heavy-tailed: single jobs run for weeks, which would make one job the whole
       makespan);
    3. the first candidate whose largest job GPU area ≤ ½ × (window GPU area ÷ GPUs) is
       the trace's window (no single job outlasts half a GPU's share of the work);
    4. time scales: service times are divided so that the window's median service time
       is ``MEDIAN_SERVICE_S`` (120 s: inside the fleet's cold-start range of 45–240 s,
       which is what makes a window transition-heavy; 300 s is reported too), and submission
       times are divided so that the offered load Σ p_j·tp_j ÷ (GPUs × arrival span)
       is ``OFFERED_LOAD`` (1.4: chosen once, for all windows and policies, so that the
       best policy's measured utilization lands in 70–95 %).
The resulting utilization, cold starts and model count are printed by the benchmark
next to the results, so that a reader can check the windows are transition-heavy.

Policies: :data:`BENCH_POLICIES` is a copy of the planner's registry plus the benchmarks'
variants (the shipped registry is never changed): ``cpsat-fast`` / ``tardiness-fast``
(0.1 s per planning point), ``cpsat-fast-floorpre`` / ``tardiness-fast-floorpre`` (the
same, whose CP-SAT windows never preempt: only the greedy floor decides preemptions, as
before planner/window_preemption.py) and ``cpsat/floor`` (``cpsat`` at its own limit,
windows never preempt).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from makespan.models import parse_fleet
from makespan.traces import read_trace
from dataclasses import replace

from makespan.planner.model import PlanJob
from makespan.planner.policies import POLICY_REGISTRY
from makespan.traces import traces_dir

ITP = str(traces_dir() / "msft-itp-2021") + "/"
ALIBABA = str(traces_dir() / "alibaba-fgd-2023" / "openb_pod_list_default.csv")
TRACES = [ITP + "cluster02.csv", ITP + "cluster05.csv", ITP + "cluster09.csv", ALIBABA]
MEDIAN_SERVICE_S = 120.0
FAST_LIMIT_S = 0.1  # the *-fast variants' time limit per planning point, s
BENCH_POLICIES = POLICY_REGISTRY.with_policies(
    replace(POLICY_REGISTRY["cpsat"], name="cpsat-fast", improver=False, time_limit_s=FAST_LIMIT_S,
            description=f"cpsat at {FAST_LIMIT_S} s per planning point"),
    replace(POLICY_REGISTRY["cpsat"], name="cpsat-fast-floorpre", improver=False, time_limit_s=FAST_LIMIT_S,
            window_preemption=False, description="cpsat-fast whose CP-SAT windows never preempt"),
    replace(POLICY_REGISTRY["tardiness"], name="tardiness-fast", improver=False, time_limit_s=FAST_LIMIT_S,
            description=f"tardiness at {FAST_LIMIT_S} s per planning point"),
    replace(POLICY_REGISTRY["tardiness"], name="tardiness-fast-floorpre", improver=False, time_limit_s=FAST_LIMIT_S,
            window_preemption=False, description="tardiness-fast whose CP-SAT windows never preempt"),
    replace(POLICY_REGISTRY["cpsat"], name="cpsat/floor", improver=False, window_preemption=False,
            description="cpsat whose CP-SAT windows never preempt"),
)
OFFERED_LOAD = 1.4


def bench_fleet(gpus: int):
    hosts = [{"name": f"h{i}", "gpu_count": 8, "memory_mib": 81920} for i in range(max(1, gpus // 8))]
    eps = {
        "m1": (1, 45, None), "m2": (1, 90, None), "m3": (1, 150, None), "m4": (1, 240, 20),
        "m5": (1, 60, None), "m6": (1, 120, None), "t2": (2, 120, None), "t4": (4, 200, None),
    }
    out = {}
    for n, (tp, cold, wake) in eps.items():
        d = {"model": n, "tensor_parallel": tp, "memory_mib_per_gpu": 20000 * tp, "cold_start_s": cold, "evict_s": 5}
        if wake:
            d["wake_s"] = wake
        out[n] = d
    out["m1"]["set_point"] = [{"host": "h0", "gpus": [0]}]
    out["m2"]["set_point"] = [{"host": "h0", "gpus": [1]}]
    return parse_fleet({"name": f"bench{gpus}", "hosts": hosts, "endpoints": out})


def _cap(rows) -> float:
    return statistics.quantiles([j.service_s for j in rows], n=20)[-1]


def select_window(path: str, fleet, n: int, gpus: int, max_rows: int = 20000) -> int:
    """First row of the trace's window (module doc, steps 1–3). Raises ValueError if none."""
    return select_windows(path, fleet, n, gpus, 1, max_rows)[0]


def select_windows(path: str, fleet, n: int, gpus: int, k: int, max_rows: int = 20000) -> list[int]:
    """First rows of the trace's first ``k`` windows that pass the rule (module doc,
    steps 1–3; ``k`` = 1: :func:`select_window`). Raises ValueError if none passes."""
    tp = {name: e.tensor_parallel for name, e in fleet.endpoints.items()}
    rows = read_trace(path, fleet, seed=0, limit=max_rows)
    out: list[int] = []
    for st in range(0, len(rows) - n + 1, n):
        js = rows[st:st + n]
        cap = _cap(js)
        areas = [min(j.service_s, cap) * tp[j.endpoint] for j in js]
        if max(areas) <= 0.5 * sum(areas) / gpus:
            out.append(st)
            if len(out) >= k:
                break
    if not out:
        raise ValueError(f"{path}: no window of {n} rows passes the rule")
    return out


def window_jobs(path: str, fleet, start: int, n: int, seed: int, gpus: int) -> tuple[list[PlanJob], dict]:
    """The window's jobs as planner jobs (module doc, steps 2 and 4) and its scaling
    {service_scale, arrival_scale, offered_load, models}."""
    tp = {k: e.tensor_parallel for k, e in fleet.endpoints.items()}
    js = read_trace(path, fleet, seed=seed, start=start, limit=n)
    cap = _cap(js)
    svc = [min(j.service_s, cap) for j in js]
    s_scale = statistics.median(svc) / MEDIAN_SERVICE_S
    area = sum(s * tp[j.endpoint] for s, j in zip(svc, js)) / s_scale
    span = max(j.submit_s for j in js) - min(j.submit_s for j in js)
    a_scale = span / (area / (gpus * OFFERED_LOAD)) if span > 0 else 1.0
    t0 = min(j.submit_s for j in js)
    out = [PlanJob(j.id, j.endpoint, float(j.priority.weight), (j.submit_s - t0) / a_scale, s / s_scale,
                   int(j.priority), seq=i) for i, (j, s) in enumerate(zip(js, svc))]
    return out, {"service_scale": s_scale, "arrival_scale": a_scale, "offered_load": OFFERED_LOAD,
                 "models": len({j.endpoint for j in js})}


def mean_sd(xs: Sequence[float]) -> str:
    """``mean ± stdev`` of a benchmark column (stdev 0 for one value)."""
    return f"{statistics.mean(xs):.3g} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.2g}"


def ratio_cell(res: dict[str, list[dict]], policy: str, base: str, key: str, floor: float = 0.0) -> str:
    """Mean ± stdev over replays of ``res[policy][i][key] ÷ res[base][i][key]`` (the
    denominator at least ``floor``), or "–" when ``base`` was not run."""
    if base not in res:
        return "–"
    return mean_sd([r[key] / max(b[key], floor) for r, b in zip(res[policy], res[base])])
