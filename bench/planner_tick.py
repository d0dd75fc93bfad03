"""Live-tick latency: ``plan()`` per policy and time limit for queue sizes a live planner
sees, on 8 and 32 GPUs, with the gain over the greedy portfolio.

Batches are consecutive rows of ITP cluster09 (times ÷ 20, all queued: releases kept),
mapped with seeds 0–2, planned from the bench fleet's set point. Prints p50/p95 of CPU
(``time.process_time``) and wall milliseconds, and the median gain (%) of the score over
``portfolio``. Answers: which policy and ``time_limit_s`` keep a 0.05–0.1 s tick.

``--beside-solve`` measures instead the live planner's tick (the greedy ``portfolio``
floor, ``--beside-jobs`` jobs on ``--beside-gpus`` GPUs) while the background improver
(workers/improver.py, policy ``default`` at ``--solve-limit-s``) solves, with its
executor ``thread`` (sharing the GIL) and ``process`` (a child process, at niceness 0
and ``--nice``), against the floor alone measured in the same run. The rows are
measured in ``--rounds`` interleaved rounds (the machine's other load drifts), with no
other row's solve running; only ticks that start and end while a solve runs count. The
GIL switch interval is the live planner's (1 ms, app/cli.py). Prints p50/p95 wall ms,
their ratios to the alone baseline, and the load average (the machine may be shared).

    .venv/bin/python bench/planner_tick.py [--sizes 7,32,128,256] [--limits 0.05,0.2]
    .venv/bin/python bench/planner_tick.py --beside-solve [--ticks 60] [--rounds 3] [--solve-limit-s 2]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.traces import read_trace  # noqa: E402
from makespan.planner.api import plan  # noqa: E402
from makespan.planner.evaluator import score  # noqa: E402
from makespan.planner.measures import percentile  # noqa: E402
from makespan.planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from planner_common import ITP, bench_fleet  # noqa: E402
from makespan.cli import GIL_SWITCH_INTERVAL_S  # noqa: E402
from makespan.settings import Settings  # noqa: E402
from makespan.workers.improver import BackgroundImprover  # noqa: E402


def _batches(fleet, n: int) -> list:
    """Three batches of ``n`` consecutive cluster09 rows (seeds 0–2, times ÷ 20)."""
    return [to_plan_jobs(read_trace(ITP + "cluster09.csv", fleet, seed=s, start=3000 + 300 * s, limit=n), 20.0)
            for s in range(3)]


class _Row:
    """One improver under measure: the batch it was last offered and its solves' gains."""

    def __init__(self, imp: BackgroundImprover):
        self.imp, self.last, self.gains = imp, None, []

    def keep_busy(self, batches: list, state) -> None:
        """When no solve runs: note the gain (%) of the last solve over the portfolio on
        its batch, and offer another batch."""
        if not self.imp.wait_idle(0.0):
            return
        if self.last is not None:
            floor = plan(self.last, state, "portfolio")
            self.gains.append(100 * (1 - score(self.imp.best(floor, self.last, state)) / score(floor)))
        self.last = next((b for b in batches if b is not self.last and self.imp.offer(b, state)), None)
        if self.last is None:
            raise RuntimeError("the improver did not start a solve")


def _ticks(batches: list, state, n: int, row: _Row | None = None) -> list[float]:
    """Wall ms of ``n`` portfolio ticks (cycling over ``batches``); with ``row``, a solve
    is kept running and only ticks with a solve running throughout count."""
    out: list[float] = []
    i = 0
    while len(out) < n:
        if row is not None:
            row.keep_busy(batches, state)
        t = time.perf_counter()
        plan(batches[i % len(batches)], state, "portfolio")
        wall_ms = 1000 * (time.perf_counter() - t)
        i += 1
        if row is None or not row.imp.wait_idle(0.0):
            out.append(wall_ms)
    return out


def beside_solve(a) -> None:
    """The ``--beside-solve`` table (module doc)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    fleet = bench_fleet(a.beside_gpus)
    base = fleet_state(fleet)
    batches = _batches(fleet, a.beside_jobs)
    rows = {"thread": _Row(BackgroundImprover("default", a.solve_limit_s, executor="thread"))}
    for nice in sorted({0, a.nice}):
        rows[f"process, nice {nice}"] = _Row(BackgroundImprover("default", a.solve_limit_s, child_nice=nice))
    load0 = os.getloadavg()
    ticks: dict[str, list[float]] = {"alone": [], **{name: [] for name in rows}}
    per = -(-a.ticks // a.rounds)
    try:
        for _ in range(a.rounds):  # interleaved: the machine's other load drifts
            for name in ticks:
                for row in rows.values():  # no other solve runs during a row
                    row.imp.wait_idle(10 * a.solve_limit_s)
                row = rows.get(name)
                if row is not None and row.imp.executor == "process" and row.imp.child_pid(0.0) is None:
                    row.keep_busy(batches, base)  # start the child: its imports are no tick
                    row.imp.child_pid()
                ticks[name] += _ticks(batches, base, per, row)
    finally:
        for row in rows.values():
            row.imp.close()
    print(f"{a.beside_jobs} jobs on {a.beside_gpus} GPUs, solve limit {a.solve_limit_s} s, {a.rounds} interleaved "
          f"rounds, {os.cpu_count()} CPUs, load average (1 min) {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    p50, p95 = percentile(ticks["alone"], 50), percentile(ticks["alone"], 95)
    print("| portfolio tick | ticks | wall ms p50 | p95 | p50 ÷ alone | p95 ÷ alone | solves timed | their gain % (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, xs in ticks.items():
        g = rows[name].gains if name in rows else []
        label = f"beside a solve, {name}" if name in rows else "alone (the baseline)"
        gain = f"{len(g)} | {statistics.median(g):.2f}" if g else "– | –"
        print(f"| {label} | {len(xs)} | {percentile(xs, 50):.1f} | {percentile(xs, 95):.1f} | "
              f"{percentile(xs, 50) / p50:.2f} | {percentile(xs, 95) / p95:.2f} | {gain} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="7,32,128,256")
    ap.add_argument("--limits", default="0.05,0.2")
    ap.add_argument("--gpus", default="8,32")
    ap.add_argument("--beside-solve", action="store_true", help="tick latency beside an improver solve (module doc)")
    ap.add_argument("--beside-jobs", type=int, default=256)
    ap.add_argument("--beside-gpus", type=int, default=32)
    ap.add_argument("--ticks", type=int, default=60, help="ticks per row (--beside-solve), all rounds together")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--solve-limit-s", type=float, default=2.0)
    ap.add_argument("--nice", type=int, default=Settings().improver_nice,
                    help="a second process row with this child niceness (default: the live planner's)")
    a = ap.parse_args()
    if a.beside_solve:
        beside_solve(a)
        return
    runs = [("wspt", None), ("portfolio", None)] + [("cpsat", float(x)) for x in a.limits.split(",")]
    print("| GPUs | jobs | policy | time_limit_s | CPU ms p50 | p95 | wall ms p50 | p95 | gain over portfolio % (median) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for g in [int(x) for x in a.gpus.split(",")]:
        fleet = bench_fleet(g)
        base = fleet_state(fleet)
        for n in [int(x) for x in a.sizes.split(",")]:
            batches = _batches(fleet, n)
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
