"""Issue 20 bench (a): the transition the plan chooses (keep, sleep level 1 or 2, stop),
on the swap-heavy scenario and on the bench's trace windows with half of the endpoints
sleep-capable.

Scenarios:
    * swap-heavy (:func:`makespan.planner.synthetic.swap_heavy`): five models A–E over three
      GPU slots of one host, requests in llama-swap#612's interleaved queue (A B A A C A B C,
      with rare D and E); A, C and E sleep-capable (level 1 and 2); 64 GiB of host RAM for
      sleepers (one level-1 sleeper of these models fits);
    * trace windows (bench/planner_common.py's window rule, 16 GPUs, 200 jobs): the bench
      fleet with m1, m3, m5 and t2 sleep-capable too (wake = cold start ÷ 10 at level 1,
      ÷ 4 at level 2; m4 keeps its level-1 wake of 20 s), 160 GiB of RAM for sleepers per host.

Policies: ``fifo`` and ``min-evict`` (they stop every displaced instance), ``default``
(CP-SAT on the portfolio floor; chooses the transition), ``default + prewarm`` (the same
with the simulator's ``prewarm``: wake sleepers on idle groups ahead of demand, issue 20
point 5, :mod:`makespan.planner.prewarm`), and ``default`` on the same fleet with sleep
disabled (no endpoint has a sleep mode); ``portfolio`` with and without prewarm, the
same comparison without CP-SAT's wall-clock limit (deterministic: the default's CP-SAT
runs 0.1 s of wall time per planning point, so its result moves with the machine's
load). Columns: weighted completion (weight·s) and ÷ fifo, ÷ without prewarm (a prewarm
row against the same policy without it), cold starts, cold
starts avoided (the sleep-disabled default's cold starts − this run's), sleeps (at level
1 / level 2), wakes, prewarms, and the host RAM peak of sleepers against its budget.

Run: ``.venv/bin/python bench/swap_heavy.py [--seeds 3] [--windows 1] [--time-limit-s 0.1]
[--gap-s 6] [--traces 4]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from makespan.models import FleetSpec, parse_fleet  # noqa: E402
from makespan.planner.evaluator import InfeasiblePlan  # noqa: E402
from makespan.planner.simulator import simulate  # noqa: E402
from makespan.planner.synthetic import swap_heavy, swap_heavy_fleet  # noqa: E402

# (row, policy, sleep mode on, prewarm)
RUNS = (("fifo", "fifo", True, False), ("min-evict", "min-evict", True, False), ("default", "default", True, False),
        ("default + prewarm", "default", True, True), ("default, sleep disabled", "default", False, False),
        ("portfolio", "portfolio", True, False), ("portfolio + prewarm", "portfolio", True, True))
PREWARM_PAIRS = {"default + prewarm": "default", "portfolio + prewarm": "portfolio"}
WINDOW_SLEEPY = {"m1", "m3", "m5", "t2"}
WINDOW_HOST_RAM_MIB = 160 * 1024


def window_fleet(gpus: int, sleep: bool) -> FleetSpec:
    """The bench fleet with half of its endpoints sleep-capable (module doc), or none."""
    from bench.planner_common import bench_fleet

    fleet = bench_fleet(gpus)
    eps = {}
    for name, spec in fleet.endpoints.items():
        if not sleep:
            eps[name] = spec.model_copy(update={"wake_s": None, "wake_level2_s": None})
        elif name in WINDOW_SLEEPY:
            eps[name] = spec.model_copy(update={"wake_s": spec.cold_start_s / 10, "wake_level2_s": spec.cold_start_s / 4})
        else:
            eps[name] = spec
    hosts = [h.model_copy(update={"host_memory_mib": WINDOW_HOST_RAM_MIB}) for h in fleet.hosts]
    return fleet.model_copy(update={"endpoints": eps, "hosts": hosts})


def _row(rep: dict) -> dict:
    tr = rep["transitions"]
    ram = rep.get("host_ram", {})
    return {"wc": rep["weighted_completion_s"], "cold": tr["cold_start"], "sleep": tr["sleep"], "wake": tr["wake"],
            "l1": tr["sleep_level1"], "l2": tr["sleep_level2"], "prewarm": tr.get("prewarm", 0),
            "ram_peak": ram.get("peak_mib", 0.0), "ram_budget": min(ram.get("budget_mib", {0: 0}).values())}


def _table(title: str, results: dict[str, list[dict]]) -> None:
    print(f"\n### {title}\n")
    print("| policy | weighted completion (weight·s) | ÷ fifo | ÷ without prewarm | cold starts | cold starts avoided "
          "| sleeps (L1 / L2) | wakes | prewarms | host RAM peak / budget (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base, nosleep = results["fifo"], results["default, sleep disabled"]
    for name, rows in results.items():
        ratio = statistics.mean(r["wc"] / b["wc"] for r, b in zip(rows, base))
        pair = PREWARM_PAIRS.get(name)
        vs_without = f"{statistics.mean(r['wc'] / d['wc'] for r, d in zip(rows, results[pair])):.4f}" if pair else "—"
        avoided = statistics.mean(n["cold"] - r["cold"] for r, n in zip(rows, nosleep))
        mean = {k: statistics.mean(r[k] for r in rows) for k in ("wc", "cold", "sleep", "wake", "l1", "l2", "prewarm")}
        peak = max(r["ram_peak"] for r in rows)
        print(f"| {name} | {mean['wc']:.0f} | {ratio:.3f} | {vs_without} | {mean['cold']:.1f} | {avoided:.1f} "
              f"| {mean['sleep']:.1f} ({mean['l1']:.1f} / {mean['l2']:.1f}) | {mean['wake']:.1f} "
              f"| {mean['prewarm']:.1f} | {peak:.0f} / {rows[0]['ram_budget']} |")
    print()
    for name, pair in PREWARM_PAIRS.items():
        wins = [(r["wc"] < d["wc"] - 1e-6) - (r["wc"] > d["wc"] + 1e-6) for r, d in zip(results[name], results[pair])]
        print(f"{name} vs {pair}, per replay: {wins.count(1)} better, {wins.count(0)} equal, {wins.count(-1)} worse")


def swap_heavy_table(seeds: int, rounds: int, time_limit_s: float, gap_s: float) -> None:
    results: dict[str, list[dict]] = {name: [] for name, _, _, _ in RUNS}
    for seed in range(seeds):
        jobs = swap_heavy(rounds, seed, gap_s=gap_s)
        for name, policy, sleep, prewarm in RUNS:
            fleet = parse_fleet(swap_heavy_fleet(sleepy="ACE" if sleep else ""))
            results[name].append(_row(simulate(jobs, fleet, policy, seed, restore=False, time_limit_s=time_limit_s,
                                               prewarm=prewarm)))
    _table(f"swap-heavy: {len(swap_heavy(rounds, 0))} requests, one every {gap_s:g} s on average, 5 models, 3 GPUs, "
           f"A/C/E sleep-capable, {seeds} seeds", results)


def window_table(seeds: int, windows: int, time_limit_s: float, traces: int = 4, n: int = 200) -> None:
    from bench.planner_common import TRACES, select_windows, window_jobs

    gpus = 16
    plain = window_fleet(gpus, True)
    results: dict[str, list[dict]] = {name: [] for name, _, _, _ in RUNS}
    count = 0
    failed: list[str] = []
    for path in TRACES[:traces]:
        try:
            starts = select_windows(str(path), plain, n, gpus, windows)
        except (ValueError, OSError):
            continue
        for st in starts:
            for seed in range(seeds):
                jobs, _ = window_jobs(path, plain, st, n, seed, gpus)
                rows = {}
                try:
                    for name, policy, sleep, prewarm in RUNS:
                        fleet = window_fleet(gpus, sleep)
                        rows[name] = _row(simulate(jobs, fleet, policy, seed, time_limit_s=time_limit_s,
                                                   prewarm=prewarm))
                except InfeasiblePlan as e:  # a planner bug: reported, the window left out of the table
                    failed.append(f"{Path(path).name} row {st} seed {seed}, {name}: {e}")
                    continue
                count += 1
                for name, row in rows.items():
                    results[name].append(row)
    for line in failed:
        print(f"FAILED (left out): {line}")
    if count:
        _table(f"trace windows: {count} replays ({windows}/trace × {seeds} seeds), {n} jobs, {gpus} GPUs, "
               f"half of the endpoints sleep-capable", results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12, help="repeats of the interleaved pattern (swap-heavy)")
    ap.add_argument("--windows", type=int, default=1, help="windows per trace (4 traces)")
    ap.add_argument("--time-limit-s", type=float, default=0.1, help="default's CP-SAT limit per planning point, s")
    ap.add_argument("--gap-s", type=float, default=6.0, help="mean gap between swap-heavy requests, s")
    ap.add_argument("--traces", type=int, default=4, help="how many of the 4 traces (ITP 02/05/09, Alibaba)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per trace window")
    ap.add_argument("--skip-traces", action="store_true")
    ap.add_argument("--skip-swap-heavy", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if not args.skip_swap_heavy:
        swap_heavy_table(args.seeds, args.rounds, args.time_limit_s, args.gap_s)
    if not args.skip_traces:
        window_table(args.seeds, args.windows, args.time_limit_s, args.traces, args.jobs)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
