"""Benchmark (a): policies in the simulator over real trace windows × seeds.

Windows: the transition-heavy window rule of ``bench/planner_common.py`` (3 ITP clusters
and the Alibaba pod list; a documented rule, the same for every policy and seed).

Prints, per policy, mean ± stdev over windows × seeds of weighted completion, makespan,
cold starts, and ratios against fifo / min-evict / wspt and weighted ÷ lower bound.
``cpsat-fast`` is the default policy (portfolio + CP-SAT LNS) with a 0.1 s limit per
batch (the 1 s default makes a replay of hundreds of planning points too long here).
Preemption and set-point restore are on, as in the live planner worker (the simulator's
defaults); ``--no-preemption`` / ``--no-restore`` switch them off. Restores are planned
(``--planned-restore group``, the default: when the group's last planned job ends;
``horizon``: when the plan's last job ends; ``none``: only the live worker's idle rule,
the simulator before plans held restores). The summary line states which, and the table
adds preemptions, restores and set-point absence (GPU-s a set-point instance was not
resident) per replay, then p95 waits per priority level.

    .venv/bin/python bench/planner_policies.py [--jobs 200] [--gpus 16] [--seeds 3] [--with-cpsat]
        [--median-service-s 120] [--offered-load 1.4] [--no-preemption] [--no-restore] [--plan-preemption]
        [--planned-restore {group,horizon,group-demand,none}]

The plain rows use the fixed preemption rule (``preemption="rule"``, as before the scored
decision existed, so older tables stay comparable); ``--plan-preemption`` adds a row
``POLICY@plan`` (preemption scored inside the plan, planner/preemption_plan.py, the
simulator's default) after each policy that has one (portfolio, cpsat-fast).
``cpsat-fast-floorpre`` (name it in ``--policies``) is cpsat-fast whose CP-SAT windows
do not decide preemptions (only the greedy floor does): ``cpsat-fast@plan`` against
``cpsat-fast-floorpre@plan`` in one run measures planner/window_preemption.py.
"""

import argparse
import statistics as stt
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.planner.api import POLICIES, PREEMPTION_FLOOR  # noqa: E402
from makespan.planner.cpsat import cpsat_policy  # noqa: E402
from makespan.planner.simulator import simulate  # noqa: E402
import planner_common  # noqa: E402
from planner_common import TRACES, bench_fleet, mean_sd, ratio_cell, select_window, window_jobs  # noqa: E402
POLS = ["fifo", "min-evict", "wspt", "portfolio", "cpsat-fast"]


def cpsat_fast_floor_preemption(batch, state, time_limit_s=0.1, seed=0, num_workers=1, previous=None):
    """``cpsat-fast`` whose CP-SAT windows never preempt (no ``preemption`` parameter):
    only the greedy floor decides preemptions, as before planner/window_preemption.py."""
    return cpsat_policy(batch, state, time_limit_s=time_limit_s, seed=seed, num_workers=num_workers,
                        previous=previous)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--policies", default=None, help="comma-separated subset")
    ap.add_argument("--median-service-s", type=float, default=planner_common.MEDIAN_SERVICE_S)
    ap.add_argument("--offered-load", type=float, default=planner_common.OFFERED_LOAD)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--with-cpsat", action="store_true", help="also cpsat-fast (5–20 s per replay here)")
    ap.add_argument("--no-preemption", dest="preemption", action="store_false", help="simulate without preemption")
    ap.add_argument("--no-restore", dest="restore", action="store_false", help="simulate without set-point restore")
    ap.add_argument("--planned-restore", choices=["group", "horizon", "group-demand", "none"], default="group",
                    help="where plans place restores (none: the idle rule only)")
    ap.add_argument("--plan-preemption", action="store_true",
                    help="add a row POLICY@plan (preemption scored inside the plan) after each policy that has one; "
                         "the other rows use the fixed rule")
    a = ap.parse_args()
    planner_common.MEDIAN_SERVICE_S, planner_common.OFFERED_LOAD = a.median_service_s, a.offered_load
    pols = POLS if a.with_cpsat else POLS[:-1]
    if a.policies:
        pols = a.policies.split(",")
    POLICIES["cpsat-fast"] = partial(cpsat_policy, time_limit_s=0.1)
    PREEMPTION_FLOOR["cpsat-fast"] = "portfolio"
    POLICIES["cpsat-fast-floorpre"] = cpsat_fast_floor_preemption
    PREEMPTION_FLOOR["cpsat-fast-floorpre"] = "portfolio"
    if a.plan_preemption:
        pols = [x for p in pols for x in ([p, p + "@plan"] if p in PREEMPTION_FLOOR else [p])]
    fleet = bench_fleet(a.gpus)
    res: dict[str, list[dict]] = {p: [] for p in pols}
    windows = [(path, select_window(path, fleet, a.jobs, a.gpus)) for path in TRACES]
    for path, start in windows:
        for seed in range(a.seeds):
            jobs, info = window_jobs(path, fleet, start, a.jobs, seed, a.gpus)
            print(f"# {Path(path).stem}@{start} seed={seed} models={info['models']} "
                  f"service ÷{info['service_scale']:.3g} arrivals ÷{info['arrival_scale']:.3g}", flush=True)
            for p in pols:
                r = simulate(jobs, fleet, p.removesuffix("@plan"), seed, restore=a.restore,
                             preemption=a.preemption and ("plan" if p.endswith("@plan") else "rule"),
                             planned_restore=None if a.planned_restore == "none" else a.planned_restore)
                res[p].append(r)
                print(f"{Path(path).stem}@{start} seed={seed} {p:10s} wc={r['weighted_completion_s']:.4g} "
                      f"mk={r['makespan_s']:.0f} cold={r['transitions']['cold_start']} util={r['utilization']:.2f} "
                      f"lb_ratio={r['best_over_lower_bound']:.2f} preempted={r['jobs']['preempted']} "
                      f"restores={r['transitions']['restore']} absent={r['set_point_absent_gpu_s']:.0f} "
                      f"wall={r['sim']['wall_s']:.1f}s", flush=True)

    ms = mean_sd
    print(f"\n{a.jobs} jobs per window, {a.gpus} GPUs, {len(windows)} windows "
          f"({', '.join(f'{Path(p).stem}@{s}' for p, s in windows)}) × {a.seeds} seeds; "
          f"median service {a.median_service_s:g} s, offered load {a.offered_load:g}; "
          f"preemption {'on (plain rows: the rule; @plan rows: scored)' if a.preemption else 'off'}, set-point restore "
          f"{'planned ' + a.planned_restore if a.restore else 'off'}")
    print("| policy | weighted completion (s) | makespan (s) | cold starts | util | ÷ fifo | ÷ min-evict | ÷ wspt "
          "| ÷ portfolio | ÷ lower bound | preemptions | restores | set-point absent GPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in pols:
        rs = res[p]
        def ratio(base):
            return ratio_cell(res, p, base, "weighted_completion_s")
        print(f"| {p} | {ms([r['weighted_completion_s'] for r in rs])} | {ms([r['makespan_s'] for r in rs])} | "
              f"{ms([r['transitions']['cold_start'] for r in rs])} | {ms([r['utilization'] for r in rs])} | "
              f"{ratio('fifo')} | {ratio('min-evict')} | {ratio('wspt')} | {ratio('portfolio')} | {ms([r['best_over_lower_bound'] for r in rs])} | "
              f"{ms([r['jobs']['preempted'] for r in rs])} | {ms([r['transitions']['restore'] for r in rs])} | "
              f"{ms([r['set_point_absent_gpu_s'] for r in rs])} |")
    print("\np95 wait per priority level (s), mean over the replays; cut work (preempted GPU-seconds) per replay")
    print("| policy | CRITICAL | HIGH | NORMAL | LOW | cut GPU-s |")
    print("|---|---|---|---|---|---|")
    for p in pols:
        rs = res[p]
        lv = [stt.mean(x) if (x := [r["wait_s"][k]["p95"] for r in rs if r["wait_s"][k]["p95"] is not None]) else 0.0
              for k in ("CRITICAL", "HIGH", "NORMAL", "LOW")]
        print(f"| {p} | " + " | ".join(f"{v:.0f}" for v in lv) + f" | {stt.mean(r['sim']['preempted_gpu_s'] for r in rs):.0f} |")
    print(f"\nPer window (mean over {a.seeds} seeds): weighted completion ÷ fifo / ÷ wspt / cold starts / util; "
          "last column: the lower bound ÷ fifo, below which no policy can go on that window")
    print("| window | " + " | ".join(pols) + " | lower bound ÷ fifo |")
    print("|---|" + "---|" * (len(pols) + 1))
    for w, (path, start) in enumerate(windows):
        cells = []
        for p in pols:
            rs = res[p][w * a.seeds:(w + 1) * a.seeds]
            f = [b["weighted_completion_s"] for b in res["fifo"][w * a.seeds:(w + 1) * a.seeds]] if "fifo" in res else None
            ws = [b["weighted_completion_s"] for b in res["wspt"][w * a.seeds:(w + 1) * a.seeds]] if "wspt" in res else None
            wc = [r["weighted_completion_s"] for r in rs]
            rf = f"{stt.mean(x / y for x, y in zip(wc, f)):.3f}" if f else "–"
            rw = f"{stt.mean(x / y for x, y in zip(wc, ws)):.3f}" if ws else "–"
            cells.append(f"{rf} / {rw} / {stt.mean(r['transitions']['cold_start'] for r in rs):.0f} / "
                         f"{stt.mean(r['utilization'] for r in rs):.2f}")
        lbf = "–"
        if "fifo" in res:  # best_over_lower_bound = weighted completion ÷ lower bound
            lbf = f"{stt.mean(1.0 / b['best_over_lower_bound'] for b in res['fifo'][w * a.seeds:(w + 1) * a.seeds]):.3f}"
        print(f"| {Path(path).stem}@{start} | " + " | ".join(cells) + f" | {lbf} |")


if __name__ == "__main__":
    main()
