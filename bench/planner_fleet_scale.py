"""Benchmark (a) of issue 21: planner tick time as the fleet grows, old and new side by side.

Batches are the ITP windows of ``bench/planner_cpsat.py`` (three windows, ``--seeds``
mappings each, times ÷ 20, all queued at once: releases kept) on the benchmark fleet of
:mod:`planner_common` (hosts of 8 GPUs, 8 endpoints of TP 1/2/4) at its set point, for
256-job batches on 16, 32, 128, 512 and 1,024 GPUs and 1,024 jobs on 1,024 GPUs. Each
batch is planned by

    * the greedy portfolio (the floor every tick computes), new (indexed placement,
      :mod:`makespan.planner.placement_index`) and old (every candidate group scanned:
      :func:`makespan.planner.placement_index.full_scan`), one after the other in the same
      process, so both see the same machine;
    * the default policy (portfolio + CP-SAT improver, ``--limit`` s, one worker), new
      and old the same way (``--default-seeds`` mappings per window: it takes the limit
      on top of the floor).

Prints per size the wall ms p50/p95 (and the portfolio's CPU ms p50, steadier on a loaded
machine), old ÷ new, new ÷ new at 256 jobs / 32 GPUs, whether the portfolio's plans are identical
(they must be: the index chooses what the full scan chooses) and the default policy's
weighted completion new ÷ old (the improver is time-limited, so it may differ).

    .venv/bin/python bench/planner_fleet_scale.py [--seeds 2] [--default-seeds 1] [--limit 0.2]
        [--sizes 256x16,256x32,256x128,256x512,256x1024,1024x1024]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.planner import placement_index  # noqa: E402
from makespan.planner.api import plan  # noqa: E402
from makespan.planner.greedy import portfolio  # noqa: E402
from makespan.planner.measures import percentile  # noqa: E402
from makespan.planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from makespan.traces import read_trace  # noqa: E402
from planner_common import bench_fleet  # noqa: E402
from planner_cpsat import WINDOWS  # noqa: E402

SIZES = "256x16,256x32,256x128,256x512,256x1024,1024x1024"


def _timed(fn):
    """(result, wall ms, CPU ms) of ``fn()``."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - w) * 1000, (time.process_time() - c) * 1000


def _key(p):
    return [(a.job_id, a.gpus, a.start_s, a.end_s, a.load, a.evicts) for a in p.assignments]


def run_size(n: int, gpus: int, seeds: int, default_seeds: int, limit_s: float) -> dict:
    """Timings of one size: lists of wall/CPU ms per batch for each of the four runs."""
    fleet = bench_fleet(gpus)
    state = fleet_state(fleet)
    out: dict = {k: [] for k in ("new_wall", "new_cpu", "old_wall", "old_cpu", "dnew", "dold", "wc_ratio")}
    out["identical"] = 0
    out["batches"] = 0
    for path, start in WINDOWS:
        for seed in range(seeds):
            batch = to_plan_jobs(read_trace(path, fleet, seed=seed, start=start, limit=n), 20.0)
            new, wall, cpu = _timed(lambda batch=batch: portfolio(batch, state))
            out["new_wall"].append(wall)
            out["new_cpu"].append(cpu)
            with placement_index.full_scan():
                old, wall, cpu = _timed(lambda batch=batch: portfolio(batch, state))
            out["old_wall"].append(wall)
            out["old_cpu"].append(cpu)
            out["identical"] += _key(new) == _key(old) and new.stats == old.stats
            out["batches"] += 1
            if seed < default_seeds:
                dn, wall, _ = _timed(lambda batch=batch: plan(batch, state, "default", time_limit_s=limit_s, num_workers=1))
                out["dnew"].append(wall)
                with placement_index.full_scan():
                    do, wall, _ = _timed(lambda batch=batch: plan(batch, state, "default", time_limit_s=limit_s, num_workers=1))
                out["dold"].append(wall)
                out["wc_ratio"].append(dn.stats["weighted_completion"] / do.stats["weighted_completion"])
    return out


def _p(xs: list[float], q: int) -> float:
    return percentile(xs, q) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2, help="mappings per window for the portfolio runs")
    ap.add_argument("--default-seeds", type=int, default=1, help="mappings per window for the default policy")
    ap.add_argument("--limit", type=float, default=0.2, help="the default policy's improver limit, s")
    ap.add_argument("--sizes", default=SIZES, help="JOBSxGPUS,... ")
    a = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in a.sizes.split(",")]
    print(f"portfolio: {a.seeds} mapping(s) x {len(WINDOWS)} windows per size; default policy: "
          f"{a.default_seeds} x {len(WINDOWS)}, limit {a.limit:g} s, 1 worker; ms\n")
    print("| jobs / GPUs | portfolio old wall p50 / p95 | new wall p50 / p95 | old ÷ new (wall p50) "
          "| old CPU p50 | new CPU p50 | old ÷ new (CPU) | new ÷ new at 256 / 32 (wall; CPU) | identical plans "
          "| default old wall p50 / p95 | new p50 / p95 | default WC new ÷ old |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for n, g in sizes:
        r = run_size(n, g, a.seeds, a.default_seeds, a.limit)
        p50, c50, o50 = _p(r["new_wall"], 50), _p(r["new_cpu"], 50), _p(r["old_cpu"], 50)
        if (n, g) == (256, 32):
            base = (p50, c50)
        rel = f"{p50 / base[0]:.2f}; {c50 / base[1]:.2f}" if base else "–"
        wc = (f"{min(r['wc_ratio']):.4f}–{max(r['wc_ratio']):.4f}" if r["wc_ratio"] else "–")
        print(f"| {n} / {g} | {_p(r['old_wall'], 50):.0f} / {_p(r['old_wall'], 95):.0f} "
              f"| {p50:.0f} / {_p(r['new_wall'], 95):.0f} | {_p(r['old_wall'], 50) / p50:.1f} "
              f"| {o50:.0f} | {c50:.0f} | {o50 / c50:.1f} | {rel} | {r['identical']}/{r['batches']} "
              f"| {_p(r['dold'], 50):.0f} / {_p(r['dold'], 95):.0f} "
              f"| {_p(r['dnew'], 50):.0f} / {_p(r['dnew'], 95):.0f} "
              f"| {wc} |", flush=True)


if __name__ == "__main__":
    main()
