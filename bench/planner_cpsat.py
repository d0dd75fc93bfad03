"""Benchmark (b): CP-SAT LNS gain over the greedy portfolio per batch, and latency.

Batches are real ITP trace windows (64 or 256 consecutive jobs, times ÷ 20, all queued
at once: releases kept) on 8 or 32 GPUs, each mapped with ``--seeds`` seeds (default 3:
3 windows × 3 seeds = 9 batches per size); limits 0.2 / 1 / 5 s. Prints per size and
limit the gain (%) median, mean ± stdev and max, how many batches came out worse than
the floor (must be 0), and planning time p50/p95 (greedy + LNS, wall s); then the greedy
portfolio's own wall ms p50/p95 per size.

    .venv/bin/python bench/planner_cpsat.py [--limits 0.2,1,5] [--seeds 3] [--mode both|descent|windows]

``--mode``: ``both`` (the improver as shipped), ``descent`` (swap/regroup descent only,
no CP-SAT) or ``windows`` (CP-SAT windows only, no descent) — where the gain comes from.
"""

import argparse
import statistics as stt
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.traces import read_trace  # noqa: E402
from makespan.planner.cpsat import improve  # noqa: E402
from makespan.planner.evaluator import score  # noqa: E402
from makespan.planner.greedy import portfolio  # noqa: E402
from makespan.planner.measures import percentile  # noqa: E402
from makespan.planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from planner_common import ITP, bench_fleet  # noqa: E402

WINDOWS = [(ITP + "cluster02.csv", 1000), (ITP + "cluster05.csv", 500), (ITP + "cluster09.csv", 3000)]
SIZES = [(64, 8), (256, 32)]
MODES: dict[str, dict[str, bool]] = {"both": {}, "descent": {"windows_on": False}, "windows": {"local": False}}


def _row(n: int, g: int, lim: float, gains: list[float], times: list[float], worse: int) -> str:
    sd = stt.stdev(gains) if len(gains) > 1 else 0.0
    return (f"| {n} | {g} | {lim:g} | {len(gains)} | {stt.median(gains):.2f} | {stt.mean(gains):.2f} ± {sd:.2f} | "
            f"{max(gains):.2f} | {worse} | {percentile(times, 50):.2f} | {percentile(times, 95):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limits", default="0.2,1,5")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--mode", choices=sorted(MODES), default="both")
    a = ap.parse_args()
    mode = MODES[a.mode]
    limits = [float(x) for x in a.limits.split(",")]
    print("| jobs | GPUs | limit (s) | batches | gain median % | gain mean ± stdev % | gain max % | worse "
          "| plan time p50 (s) | p95 (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    greedy_rows = []
    for n, g in SIZES:
        fleet = bench_fleet(g)
        base = fleet_state(fleet)
        rows: dict[float, tuple[list[float], list[float], int]] = {lim: ([], [], 0) for lim in limits}
        greedy_ms = []
        for path, start in WINDOWS:
            for seed in range(a.seeds):
                batch = to_plan_jobs(read_trace(path, fleet, seed=seed, start=start, limit=n), 20.0)
                t = time.perf_counter()
                floor = portfolio(batch, base)
                tg = time.perf_counter() - t
                greedy_ms.append(tg * 1000)
                for lim in limits:
                    t = time.perf_counter()
                    out = improve(batch, base, floor, time_limit_s=lim, seed=seed, **mode)
                    dt = time.perf_counter() - t + tg
                    gains, times, worse = rows[lim]
                    gains.append(100 * (1 - score(out) / score(floor)))
                    times.append(dt)
                    rows[lim] = (gains, times, worse + (score(out) > score(floor) + 1e-6))
        for lim in limits:
            print(_row(n, g, lim, *rows[lim]), flush=True)
        greedy_rows.append(f"| {n} | {g} | {len(greedy_ms)} | {percentile(greedy_ms, 50):.1f} | "
                           f"{percentile(greedy_ms, 95):.1f} |")
    print("\nGreedy portfolio (the floor), wall ms per batch:\n")
    print("| jobs | GPUs | batches | p50 ms | p95 ms |\n|---|---|---|---|---|")
    print("\n".join(greedy_rows))


if __name__ == "__main__":
    main()
