"""Benchmark (c): planner cost per job in the simulator at 1k, 10k and 100k jobs, and the
greedy portfolio's latency for 256 jobs on 32 GPUs.

Job stream: the first ``--tile`` rows (default 1000) of ITP cluster09, mapped with seed 0,
service times winsorized at their 95th percentile and divided so the median is 300 s,
arrivals divided so the offered load on the fleet is ``--load`` (0.6: with the cold starts
on top the queue stays stable; at 0.9 the transitions push the effective load over 1 and
the queue — and so the batch and the cost per job — grows with the stream), tiled (copy k shifted by k ×
the tile's span, ids suffixed) — a stationary stream, so that 1k, 10k and 100k jobs see
the same queue depths and the ratio measures how the planner's cost grows with the
length of the history (``--tile 0``: the whole 11k-row trace, whose later part is
burstier: the queue, and so the batch, grows). The first n jobs are simulated.
Cost per job = Σ planning time (``plan()`` calls) ÷ n, in CPU seconds of this process
(``time.process_time``; wall time is printed too — the machine is shared, so wall time is
noisy). Ratio = cost per job ÷ cost per job at the smallest n, measured in the same run.

    .venv/bin/python bench/planner_scale.py [--sizes 1000,10000,100000] [--policy portfolio] [--gpus 16]
"""

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import makespan.planner.simulator as sim  # noqa: E402
import makespan.planner.simulator_run as sim_run  # noqa: E402
from makespan.traces import read_trace  # noqa: E402
from makespan.planner.greedy import portfolio  # noqa: E402
from makespan.planner.measures import percentile  # noqa: E402
from makespan.planner.model import PlanJob  # noqa: E402
from makespan.planner.simulator import fleet_state, simulate, to_plan_jobs  # noqa: E402
from planner_common import ITP, bench_fleet  # noqa: E402

TRACE = ITP + "cluster09.csv"


def stream(fleet, gpus: int, n: int, load: float = 0.9, tile: int = 1000) -> list[PlanJob]:
    tp = {k: e.tensor_parallel for k, e in fleet.endpoints.items()}
    rows = read_trace(TRACE, fleet, seed=0, limit=tile or None)
    cap = statistics.quantiles([r.service_s for r in rows], n=20)[-1]
    svc = [min(r.service_s, cap) for r in rows]
    s_scale = statistics.median(svc) / 300.0
    area = sum(s * tp[r.endpoint] for s, r in zip(svc, rows)) / s_scale
    span = max(r.submit_s for r in rows) - min(r.submit_s for r in rows)
    a_scale = span / (area / (gpus * load))
    span_s = span / a_scale + 1.0
    out: list[PlanJob] = []
    k = 0
    while len(out) < n:
        for r, s in zip(rows, svc):
            if len(out) >= n:
                break
            out.append(PlanJob(f"{r.id}#{k}", r.endpoint, float(r.priority.weight), r.submit_s / a_scale + k * span_s,
                               s / s_scale, int(r.priority), seq=len(out)))
        k += 1
    return out


def greedy_latency(reps: int = 3) -> None:
    fleet = bench_fleet(32)
    base = fleet_state(fleet)
    batches = [to_plan_jobs(read_trace(p, fleet, seed=0, start=s, limit=256), 20.0)
               for p, s in [(ITP + "cluster02.csv", 1000), (ITP + "cluster05.csv", 500), (ITP + "cluster09.csv", 3000)]]
    share = {e: 1 / len(fleet.endpoints) for e in fleet.endpoints}
    for label, st in [("no demand", base), ("with demand_share", sim.FleetState(
            0.0, base.gpus, base.endpoints, resident=dict(base.resident), demand_share=share))]:
        cpu, wall = [], []
        for _ in range(reps):
            for b in batches:
                fresh = replace(st)  # a new state per call, as at a planning point (no warm caches)
                t, c = time.perf_counter(), time.process_time()
                portfolio(b, fresh)
                cpu.append(1000 * (time.process_time() - c))
                wall.append(1000 * (time.perf_counter() - t))
        print(f"greedy portfolio, 256 jobs / 32 GPUs, {label}: CPU ms p50 {percentile(cpu, 50):.1f} "
              f"p95 {percentile(cpu, 95):.1f}; wall ms p50 {percentile(wall, 50):.1f} p95 {percentile(wall, 95):.1f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--policy", default="portfolio")
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--tile", type=int, default=1000)
    ap.add_argument("--load", type=float, default=0.6)
    a = ap.parse_args()
    if not a.skip_latency:
        greedy_latency()
    fleet = bench_fleet(a.gpus)
    sizes = [int(x) for x in a.sizes.split(",")]
    jobs_all = stream(fleet, a.gpus, max(sizes), load=a.load, tile=a.tile)
    orig_plan = sim_run.plan
    print("| jobs | planning points | mean batch | planner CPU ms/job | ratio vs first | planner wall ms/job | sim wall s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    first = None
    for n in sizes:
        cpu = [0.0, 0.0]
        sizes_seen: list[int] = []

        def timed(batch, state, policy, _c=cpu, _s=sizes_seen, **kw):
            c, t = time.process_time(), time.perf_counter()
            out = orig_plan(batch, state, policy, **kw)
            _c[0] += time.process_time() - c
            _c[1] += time.perf_counter() - t
            _s.append(len(batch))
            return out
        sim_run.plan = timed
        try:
            r = simulate(jobs_all[:n], fleet, a.policy, 0)
        finally:
            sim_run.plan = orig_plan
        per = 1000 * cpu[0] / n
        first = first or per
        wall = 1000 * cpu[1] / n
        print(f"| {n} | {r['sim']['planning_points']} | {statistics.mean(sizes_seen):.1f} | {per:.3f} | "
              f"{per / first:.2f} | {wall:.3f} | {r['sim']['wall_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
