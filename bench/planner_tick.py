"""Live-tick latency: ``plan()`` per policy and time limit for queue sizes a live planner
sees, on 8 and 32 GPUs, with the gain over the greedy portfolio.

Batches are consecutive rows of ITP cluster09 (times ÷ 20, all queued: releases kept),
mapped with seeds 0–2, planned from the bench fleet's set point. Prints p50/p95 of CPU
(``time.process_time``) and wall milliseconds, and the median gain (%) of the score over
``portfolio``. Answers: which policy and ``time_limit_s`` keep a 0.05–0.1 s tick.

    .venv/bin/python bench/planner_tick.py [--sizes 7,32,128,256] [--limits 0.05,0.2]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app.traces import read_trace  # noqa: E402
from planner.api import plan  # noqa: E402
from planner.evaluator import score  # noqa: E402
from planner.measures import percentile  # noqa: E402
from planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from planner_common import ITP, bench_fleet  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="7,32,128,256")
    ap.add_argument("--limits", default="0.05,0.2")
    ap.add_argument("--gpus", default="8,32")
    a = ap.parse_args()
    runs = [("wspt", None), ("portfolio", None)] + [("cpsat", float(x)) for x in a.limits.split(",")]
    print("| GPUs | jobs | policy | time_limit_s | CPU ms p50 | p95 | wall ms p50 | p95 | gain over portfolio % (median) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for g in [int(x) for x in a.gpus.split(",")]:
        fleet = bench_fleet(g)
        base = fleet_state(fleet)
        for n in [int(x) for x in a.sizes.split(",")]:
            batches = [to_plan_jobs(read_trace(ITP + "cluster09.csv", fleet, seed=s, start=3000 + 300 * s, limit=n), 20.0)
                       for s in range(3)]
            ref = [score(plan(b, base, "portfolio")) for b in batches]
            for pol, lim in runs:
                cpu, wall, gain = [], [], []
                for b, r in zip(batches, ref):
                    for _ in range(2):
                        t, c = time.perf_counter(), time.process_time()
                        p = plan(b, base, pol, time_limit_s=lim)
                        cpu.append(1000 * (time.process_time() - c))
                        wall.append(1000 * (time.perf_counter() - t))
                    gain.append(100 * (1 - score(p) / r) if r else 0.0)
                print(f"| {g} | {n} | {pol} | {lim if lim is not None else '–'} | {percentile(cpu, 50):.1f} | "
                      f"{percentile(cpu, 95):.1f} | {percentile(wall, 50):.1f} | {percentile(wall, 95):.1f} | "
                      f"{statistics.median(gain):.2f} |", flush=True)


if __name__ == "__main__":
    main()
