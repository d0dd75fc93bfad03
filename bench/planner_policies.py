"""Benchmark (a): policies in the simulator over real trace windows × seeds.

Prints, per policy, mean ± stdev over windows × seeds of weighted completion, makespan,
cold starts, and ratios against fifo / min-evict / wspt and weighted ÷ lower bound.
``cpsat-fast`` is the default policy (portfolio + CP-SAT LNS) with a 0.1 s limit per
batch (the 1 s default makes a replay of hundreds of planning points too long here).

    .venv/bin/python bench/planner_policies.py [--jobs 200] [--gpus 16] [--time-scale 20]
"""

import argparse
import statistics as stt
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app.traces import read_trace  # noqa: E402
from planner.api import POLICIES  # noqa: E402
from planner.cpsat import cpsat_policy  # noqa: E402
from planner.simulator import simulate  # noqa: E402
from planner_common import ITP, bench_fleet  # noqa: E402

WINDOWS = [(ITP + "cluster02.csv", 1000), (ITP + "cluster05.csv", 500), (ITP + "cluster09.csv", 3000)]
POLS = ["fifo", "min-evict", "wspt", "portfolio", "cpsat-fast"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--with-cpsat", action="store_true", help="also cpsat-fast (about 75 s per replay here)")
    a = ap.parse_args()
    pols = POLS if a.with_cpsat else POLS[:-1]
    POLICIES["cpsat-fast"] = partial(cpsat_policy, time_limit_s=0.1)
    fleet = bench_fleet(a.gpus)
    res: dict[str, list[dict]] = {p: [] for p in pols}
    for path, start in WINDOWS:
        for seed in range(a.seeds):
            jobs = read_trace(path, fleet, seed=seed, start=start, limit=a.jobs)
            for p in pols:
                r = simulate(jobs, fleet, p, seed, time_scale=a.time_scale)
                res[p].append(r)
                print(f"{Path(path).stem}@{start} seed={seed} {p:10s} wc={r['weighted_completion_s']:.4g} "
                      f"mk={r['makespan_s']:.0f} cold={r['transitions']['cold_start']} util={r['utilization']:.2f} "
                      f"lb_ratio={r['best_over_lower_bound']:.2f} wall={r['sim']['wall_s']:.1f}s", flush=True)

    def ms(xs):
        return f"{stt.mean(xs):.3g} ± {stt.stdev(xs) if len(xs) > 1 else 0:.2g}"
    print(f"\n{a.jobs} jobs per window, {a.gpus} GPUs, time scale 1/{a.time_scale:g}, "
          f"{len(WINDOWS)} windows × {a.seeds} seeds")
    print("| policy | weighted completion (s) | makespan (s) | cold starts | util | ÷ fifo | ÷ min-evict | ÷ wspt | ÷ lower bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in pols:
        rs = res[p]
        def ratio(base):
            return ms([r["weighted_completion_s"] / b["weighted_completion_s"] for r, b in zip(rs, res[base])])
        print(f"| {p} | {ms([r['weighted_completion_s'] for r in rs])} | {ms([r['makespan_s'] for r in rs])} | "
              f"{ms([r['transitions']['cold_start'] for r in rs])} | {ms([r['utilization'] for r in rs])} | "
              f"{ratio('fifo')} | {ratio('min-evict')} | {ratio('wspt')} | {ms([r['best_over_lower_bound'] for r in rs])} |")


if __name__ == "__main__":
    main()
