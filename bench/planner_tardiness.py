"""Benchmark: weighted tardiness of the tardiness policies vs the default policies vs fifo.

Windows: the window rule of ``bench/planner_common.py`` on the three ITP clusters
(cluster02, cluster05, cluster09; unchanged rule, 16 GPUs, 200 jobs), seeds 0..2.
Deadlines (synthetic, the traces have none): d_j = r_j + k_j·p_j with k_j drawn uniformly
from [K_LO, K_HI] = [2, 6] by ``random.Random(1000 + seed)`` in submission order
(p_j the window's scaled service time). Each policy replays the window in the simulator
(rolling horizon, planner/simulator.py; preemption and set-point restore on, as in the
live worker, unless ``--no-preemption`` / ``--no-restore``); reported: Σ w_j·max(0, C_j − d_j) (weight·s),
tardy jobs, weighted completion, cold starts, and the weighted-tardiness ratio to fifo
per replay (mean ± stdev over the 9 replays). Then, per window (seed 0), the window's jobs
as ONE static batch on the fleet at time 0 (releases kept): weighted tardiness of the
``tardiness-portfolio`` floor and of ``tardiness`` at ``--static-limit-s`` (the improver's
gain on a batch; one CP-SAT worker).

``portfolio`` is the live planner's per-tick floor (its default policy ``default`` runs
the improver beside it, ``workers/improver.py``); ``cpsat-fast`` /
``tardiness-fast`` are ``default`` / ``tardiness`` with a 0.1 s limit per planning point
(the simulator calls ``plan`` at every planning point; 1 s would take minutes per replay).

    .venv/bin/python bench/planner_tardiness.py [--seeds 3] [--policies fifo,portfolio,...]
        [--no-preemption] [--no-restore] [--static-limit-s 1] [--plan-preemption]

The plain rows use the fixed preemption rule; ``--plan-preemption`` adds ``POLICY@plan``
rows (preemption scored inside the plan with the policy's objective) after portfolio,
tardiness-portfolio, cpsat-fast and tardiness-fast.
"""

import argparse
import dataclasses
import random
import statistics as stt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.planner.simulator import simulate  # noqa: E402
from planner_common import BENCH_POLICIES, TRACES, bench_fleet, mean_sd, ratio_cell, select_window, window_jobs  # noqa: E402

K_LO, K_HI = 2.0, 6.0
POLS = ["fifo", "portfolio", "tardiness-portfolio", "cpsat-fast", "tardiness-fast"]



def with_deadlines(jobs, seed: int):
    """d_j = r_j + k_j·p_j, k_j ~ U[K_LO, K_HI] (module doc)."""
    rng = random.Random(1000 + seed)
    return [dataclasses.replace(j, deadline_s=j.release_s + rng.uniform(K_LO, K_HI) * j.service_s) for j in jobs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policies", default=None, help="comma-separated subset")
    ap.add_argument("--static-limit-s", type=float, default=1.0)
    ap.add_argument("--no-preemption", dest="preemption", action="store_false", help="simulate without preemption")
    ap.add_argument("--no-restore", dest="restore", action="store_false", help="simulate without set-point restore")
    ap.add_argument("--plan-preemption", action="store_true",
                    help="add a row POLICY@plan (preemption scored inside the plan) after each policy that has one; "
                         "the other rows use the fixed rule")
    a = ap.parse_args()
    pols = a.policies.split(",") if a.policies else POLS
    if a.plan_preemption:
        pols = [x for p in pols for x in ([p, p + "@plan"] if BENCH_POLICIES.lookup(p).floor else [p])]
    fleet = bench_fleet(a.gpus)
    windows = [(p, select_window(p, fleet, a.jobs, a.gpus)) for p in TRACES[:3]]
    res: dict[str, list[dict]] = {p: [] for p in pols}
    for path, start in windows:
        for seed in range(a.seeds):
            jobs, _info = window_jobs(path, fleet, start, a.jobs, seed, a.gpus)
            jobs = with_deadlines(jobs, seed)
            for p in pols:
                r = simulate(jobs, fleet, BENCH_POLICIES.lookup(p.removesuffix("@plan")), seed, restore=a.restore,
                             preemption=a.preemption and ("plan" if p.endswith("@plan") else "rule"))
                res[p].append(r)
                print(f"{Path(path).stem}@{start} seed={seed} {p:20s} wt={r['weighted_tardiness_s']:.4g} "
                      f"tardy={r['tardy_jobs']}/{r['jobs_with_deadline']} wc={r['weighted_completion_s']:.4g} "
                      f"cold={r['transitions']['cold_start']} wall={r['sim']['wall_s']:.1f}s", flush=True)

    ms = mean_sd
    print(f"\n{a.jobs} jobs per window, {a.gpus} GPUs, windows "
          f"{', '.join(f'{Path(p).stem}@{s}' for p, s in windows)} × {a.seeds} seeds; "
          f"deadlines r + U[{K_LO:g}, {K_HI:g}]·p; preemption {a.preemption}, restore {a.restore}")
    print("| policy | weighted tardiness (s) | ÷ fifo | ÷ portfolio | tardy jobs | weighted completion (s) "
          "| cold starts | preemptions |")
    print("|---|---|---|---|---|---|---|---|")
    for p in pols:
        rs = res[p]

        def ratio(base, p=p):
            return ratio_cell(res, p, base, "weighted_tardiness_s", floor=1e-9)
        print(f"| {p} | {ms([r['weighted_tardiness_s'] for r in rs])} | {ratio('fifo')} | {ratio('portfolio')} | "
              f"{ms([r['tardy_jobs'] for r in rs])} | {ms([r['weighted_completion_s'] for r in rs])} | "
              f"{ms([r['transitions']['cold_start'] for r in rs])} | {ms([r['jobs']['preempted'] for r in rs])} |")
    print(f"\nPer window (mean over {a.seeds} seeds): weighted tardiness ÷ fifo")
    print("| window | " + " | ".join(pols) + " |")
    print("|---|" + "---|" * len(pols))
    for w, (path, start) in enumerate(windows):
        sl = slice(w * a.seeds, (w + 1) * a.seeds)
        base = res.get("fifo", [])[sl]
        wt = "weighted_tardiness_s"
        cells = [f"{stt.mean(r[wt] / b[wt] for r, b in zip(res[p][sl], base)):.3f}" if base else "–" for p in pols]
        print(f"| {Path(path).stem}@{start} | " + " | ".join(cells) + " |")
    if a.static_limit_s > 0:
        static(windows, fleet, a)


def static(windows, fleet, a) -> None:
    """The improver's gain on one static batch per window (module doc)."""
    from makespan.planner.api import plan
    from makespan.planner.simulator import fleet_state
    print(f"\nStatic batch ({a.jobs} jobs, seed 0): weighted tardiness, floor → tardiness at {a.static_limit_s:g} s")
    print("| window | tardiness-portfolio | tardiness | gain % | order-search evals | LNS windows improved |")
    print("|---|---|---|---|---|---|")
    for path, start in windows:
        jobs = with_deadlines(window_jobs(path, fleet, start, a.jobs, 0, a.gpus)[0], 0)
        st = fleet_state(fleet)
        floor = plan(jobs, st, "tardiness-portfolio")
        got = plan(jobs, st, "tardiness", time_limit_s=a.static_limit_s)
        gain = 100 * (1 - got.objective / floor.objective) if floor.objective > 0 else 0.0
        print(f"| {Path(path).stem}@{start} | {floor.objective:.4g} | {got.objective:.4g} | {gain:.2f} | "
              f"{got.stats.get('order_evals', 0):.0f} | {got.stats.get('improved', 0):.0f} |")


if __name__ == "__main__":
    main()
