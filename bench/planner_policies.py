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
        [--planned-restore {group,horizon,group-demand,none}] [--reservation-after-s S|off]
        [--lane LEVELS|off] [--lane-start LEVEL:GRACE_S,...|off] [--fifo-plain] [--windows-per-trace 1] [--procs 1] [--json-out PATH]

``--reservation-after-s``: the aging bound of every replay (no starvation,
planner/reservation.py; default: the simulator's, ``off``: no reservations).
``--lane LEVELS``: the fast lane of every replay (planner/fast_lane.py; e.g. ``CRITICAL``,
``CRITICAL,HIGH:1.25``; ``off``; default: the simulator's). ``--lane-start LEVEL:GRACE_S,…``:
the lane levels bounded on start (``off``: all on completion; default: the simulator's). ``--fifo-plain``: the fifo row
without reservations and lane (strict priority as it is: the baseline of issue 19 point 4).
``--also-lane-start SPEC``: each policy but fifo also with ``--lane-start SPEC`` (a row
``POLICY start=SPEC``; ``off``: the completion-bounded lane of before, to compare before and
after in one run; several separated by ``;``, ``SPEC|LANE`` also sets that row's lane levels,
``SPEC|LANE|nopreempt`` (LANE may be empty) turns off the lane's rule preemptions, ``plan(lane_preempt=False)``). ``--windows-per-trace K``: the first K windows of each trace that pass the rule (default 1:
the developers' 4 windows). ``--procs N``: replays of N (window, seed) pairs at once.
The per-class table gives, per policy, the p95 wait of CRITICAL and HIGH ÷ fifo's on the
same replay (median and worst over the replays, and worst over the windows of the mean
over seeds); a replay where fifo's p95 is 0 counts 1.0 when the policy's is 0 too, else inf.

The plain rows use the fixed preemption rule (``preemption="rule"``, as before the scored
decision existed, so older tables stay comparable); ``--plan-preemption`` adds a row
``POLICY@plan`` (preemption scored inside the plan, planner/preemption_plan.py, the
simulator's default) after each policy that has one (portfolio, cpsat-fast).
``cpsat-fast-floorpre`` (name it in ``--policies``) is cpsat-fast whose CP-SAT windows
do not decide preemptions (only the greedy floor does): ``cpsat-fast@plan`` against
``cpsat-fast-floorpre@plan`` in one run measures planner/window_preemption.py.
"""

import argparse
import json
import math
import multiprocessing
import statistics as stt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.planner.simulator import simulate  # noqa: E402
from makespan.settings import fast_lane_levels, fast_lane_start_grace  # noqa: E402
import planner_common  # noqa: E402
from planner_common import BENCH_POLICIES, TRACES, bench_fleet, mean_sd, ratio_cell, select_windows, window_jobs  # noqa: E402
POLS = ["fifo", "min-evict", "wspt", "portfolio", "cpsat-fast"]


def _replay(arg):
    """All policies on one (trace, window start, seed): (header line, {policy: report})."""
    path, start, seed, a, pols = arg
    fleet = bench_fleet(a.gpus)
    planner_common.MEDIAN_SERVICE_S, planner_common.OFFERED_LOAD = a.median_service_s, a.offered_load
    jobs, info = window_jobs(path, fleet, start, a.jobs, seed, a.gpus)
    lines = [f"# {Path(path).stem}@{start} seed={seed} models={info['models']} "
             f"service ÷{info['service_scale']:.3g} arrivals ÷{info['arrival_scale']:.3g}"]
    out = {}
    for p in pols:
        name, _, other = p.partition(" start=")  # a row of --also-lane-start: that start bound (and lane)
        other, nopre = other.removesuffix(" nopreempt"), other.endswith(" nopreempt")
        other_start, _, other_lane = other.partition(" lane=")
        r = simulate(jobs, fleet, BENCH_POLICIES.lookup(name.removesuffix("@plan")), seed, restore=a.restore,
                     preemption=a.preemption and ("plan" if name.endswith("@plan") else "rule"),
                     planned_restore=None if a.planned_restore == "none" else a.planned_restore,
                     **(_PLAIN if a.fifo_plain and p == "fifo" else
                        {**_reservation_kw(a.reservation_after_s), **_lane_kw(other_lane or a.lane),
                         **_start_kw(other_start or a.lane_start), **({"lane_preempt": False} if nopre else {})}))
        out[p] = r
        lines.append(f"{Path(path).stem}@{start} seed={seed} {p:10s} wc={r['weighted_completion_s']:.4g} "
                     f"mk={r['makespan_s']:.0f} cold={r['transitions']['cold_start']} util={r['utilization']:.2f} "
                     f"lb_ratio={r['best_over_lower_bound']:.2f} preempted={r['jobs']['preempted']} "
                     f"restores={r['transitions']['restore']} absent={r['set_point_absent_gpu_s']:.0f} "
                     f"reserved_points={r['sim']['reserved_points']} lane_points={r['sim'].get('lane_points', 0)} "
                     f"wall={r['sim']['wall_s']:.1f}s")
    return "\n".join(lines), out


def p95_ratio(r: dict, b: dict, level: str) -> float | None:
    """p95 wait of ``level`` in report ``r`` ÷ that in the fifo report ``b`` (None: the
    level had no job; fifo 0: 1.0 when ``r``'s is 0 too, else inf)."""
    pa, pb = r["wait_s"][level]["p95"], b["wait_s"][level]["p95"]
    if pa is None or pb is None:
        return None
    if pb <= 1e-6:
        return 1.0 if pa <= 1e-6 else math.inf
    return pa / pb


def _reservation_arg(v: str) -> str | float:
    return "off" if v == "off" else float(v)


_PLAIN = {"reservation_after_s": None, "lane_levels": ()}  # strict priority as it is: no aging, no lane


def _lane_kw(v: str | None) -> dict:
    """``simulate``'s fast-lane keyword for ``--lane`` (None: its default; off: none)."""
    if v is None:
        return {}
    return {"lane_levels": () if v == "off" else fast_lane_levels(v)}


def _start_kw(v: str | None) -> dict:
    """``simulate``'s ``lane_start_grace_s`` for ``--lane-start`` (None: its default; off: none)."""
    if v is None:
        return {}
    return {"lane_start_grace_s": {} if v == "off" else fast_lane_start_grace(v)}


def _reservation_kw(v: str | float | None) -> dict:
    """``simulate``'s reservation keyword for ``--reservation-after-s`` (None: its default)."""
    return {} if v is None else {"reservation_after_s": None if v == "off" else v}


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
    ap.add_argument("--reservation-after-s", type=_reservation_arg, default=None,
                    help="aging bound of every replay, s, or off (default: the simulator's)")
    ap.add_argument("--lane", default=None,
                    help="fast-lane levels of every replay (e.g. CRITICAL or CRITICAL,HIGH), or off "
                         "(default: the simulator's)")
    ap.add_argument("--lane-start", default=None,
                    help="the lane levels bounded on start, LEVEL:GRACE_S,... (e.g. CRITICAL:30), or off: every "
                         "lane level bounded on completion (default: the simulator's)")
    ap.add_argument("--also-lane-start", default=None,
                    help="add a row 'POLICY start=SPEC' after each row but fifo, with that start bound "
                         "(e.g. off: the lane before start bounds), to compare in one run; several: "
                         "SPEC;SPEC; SPEC|LANE also sets the row's lane levels; SPEC|LANE|nopreempt: "
                         "without the lane's rule preemptions")
    ap.add_argument("--fifo-plain", action="store_true",
                    help="run fifo without reservations and fast lane (strict priority as it is), "
                         "whatever --reservation-after-s / --lane say")
    ap.add_argument("--windows-per-trace", type=int, default=1)
    ap.add_argument("--traces", default=None,
                    help="comma-separated substrings: only the traces whose file name holds one (default: all)")
    ap.add_argument("--procs", type=int, default=1, help="(window, seed) replays run at once")
    ap.add_argument("--json-out", default=None, help="write every replay's summary figures here")
    a = ap.parse_args()
    planner_common.MEDIAN_SERVICE_S, planner_common.OFFERED_LOAD = a.median_service_s, a.offered_load
    pols = POLS if a.with_cpsat else POLS[:-1]
    if a.policies:
        pols = a.policies.split(",")
    if a.plan_preemption:
        pols = [x for p in pols for x in ([p, p + "@plan"] if BENCH_POLICIES.lookup(p).floor else [p])]
    if a.also_lane_start:
        extra = [e.split("|") for e in a.also_lane_start.split(";")]  # START or START|LANE
        pols = [x for p in pols for x in ([p] if p == "fifo" else
                                          [p, *(f"{p} start={e[0]}" + (f" lane={e[1]}" if len(e) > 1 and e[1] else "")
                                                + (" nopreempt" if len(e) > 2 and e[2] == "nopreempt" else "")
                                                for e in extra)])]
    fleet = bench_fleet(a.gpus)
    res: dict[str, list[dict]] = {p: [] for p in pols}
    traces = [t for t in TRACES if not a.traces or any(x in Path(t).name for x in a.traces.split(","))]
    windows = [(path, st) for path in traces for st in select_windows(path, fleet, a.jobs, a.gpus, a.windows_per_trace)]
    args = [(path, start, seed, a, pols) for path, start in windows for seed in range(a.seeds)]
    if a.procs > 1:
        with multiprocessing.get_context("fork").Pool(a.procs) as pool:
            done = pool.map(_replay, args, chunksize=1)
    else:
        done = map(_replay, args)
    for text, out in done:
        print(text, flush=True)
        for p in pols:
            res[p].append(out[p])
    if a.json_out:
        keep = ("weighted_completion_s", "makespan_s", "utilization", "wait_s", "transitions", "jobs", "sim",
                "eta_error_s")
        Path(a.json_out).write_text(json.dumps({"args": {k: v for k, v in vars(a).items()},
                                                "windows": [f"{Path(p).stem}@{s}" for p, s in windows],
                                                "results": {p: [{k: r.get(k) for k in keep} for r in rs]
                                                            for p, rs in res.items()}}, default=str))

    ms = mean_sd
    rsv = a.reservation_after_s
    print(f"\n{a.jobs} jobs per window, {a.gpus} GPUs, {len(windows)} windows "
          f"({', '.join(f'{Path(p).stem}@{s}' for p, s in windows)}) × {a.seeds} seeds; "
          f"median service {a.median_service_s:g} s, offered load {a.offered_load:g}; "
          f"preemption {'on (plain rows: the rule; @plan rows: scored)' if a.preemption else 'off'}, set-point restore "
          f"{'planned ' + a.planned_restore if a.restore else 'off'}; reservation aging bound "
          f"{'simulator default' if rsv is None else rsv if rsv == 'off' else f'{rsv:g} s'}; fast lane "
          f"{a.lane or 'simulator default'}, bounded on start: {a.lane_start or 'simulator default'}{'; fifo plain (no reservations, no lane)' if a.fifo_plain else ''}")
    print("| policy | weighted completion (s) | makespan (s) | cold starts | util | ÷ fifo | ÷ min-evict | ÷ wspt "
          "| ÷ portfolio | ÷ lower bound | preemptions | restores | set-point absent GPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in pols:
        rs = res[p]
        def ratio(base, p=p):
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
    if "fifo" in res:
        print("\np95 wait ÷ fifo's on the same replay, per class: median / worst over the replays; "
              "worst window (mean over its seeds)")
        print("| policy | CRITICAL median | CRITICAL worst | CRITICAL worst window | HIGH median | HIGH worst "
              "| HIGH worst window |")
        print("|---|---|---|---|---|---|---|")
        for p in pols:
            cells = []
            for lvl in ("CRITICAL", "HIGH"):
                xs = [x for r, b in zip(res[p], res["fifo"]) if (x := p95_ratio(r, b, lvl)) is not None]
                per_w = []
                for w in range(len(windows)):
                    ys = [x for r, b in zip(res[p][w * a.seeds:(w + 1) * a.seeds],
                                            res["fifo"][w * a.seeds:(w + 1) * a.seeds])
                          if (x := p95_ratio(r, b, lvl)) is not None]
                    if ys:
                        per_w.append(stt.mean(ys))
                cells += [f"{stt.median(xs):.2f}" if xs else "–", f"{max(xs):.2f}" if xs else "–",
                          f"{max(per_w):.2f}" if per_w else "–"]
            print(f"| {p} | " + " | ".join(cells) + " |")
    print("\nETA error (actual start − ETA at submit, s) per class: p50 / p90, mean over the replays")
    print("| policy | CRITICAL | HIGH | NORMAL | LOW |")
    print("|---|---|---|---|---|")
    for p in pols:
        cells = []
        for lvl in ("CRITICAL", "HIGH", "NORMAL", "LOW"):
            e = [r["eta_error_s"][lvl] for r in res[p] if r.get("eta_error_s") and r["eta_error_s"][lvl]["n"]]
            cells.append(f"{stt.mean(x['p50'] for x in e):.0f} / {stt.mean(x['p90'] for x in e):.0f}" if e else "–")
        print(f"| {p} | " + " | ".join(cells) + " |")
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
