"""Benchmark: the set-point weight's trade-off in the simulator (``FleetState.set_point_weight``).

Windows and fleet: the transition-heavy window rule and fleet of ``bench/planner_common.py``
(3 ITP clusters and the Alibaba pod list × seeds; m1 on h0:0 and m2 on h0:1 at their set
points, 2 of 16 GPUs). ``--wide`` also puts m3–m6 on h0:2–5 and t2 on h1:0–1 at their
set points (8 of 16 GPUs), a bench-local variant of that fleet.

Each replay runs at every weight (``--weights``, default 0, 0.1, 1, 10; weight·s of score
per GPU-second a set-point instance is absent from a plan) with the simulator's defaults
(scored preemption, restores planned at "group"); per weight it prints the mean over
replays of weighted completion, set-point absence (GPU-s, the simulator's measure over
the whole run), restores and cold starts, each also as the mean ratio to weight 0 on the
same replay (same run).

    .venv/bin/python bench/planner_set_point.py [--policy portfolio] [--seeds 3] [--jobs 200] [--gpus 16]
        [--weights 0,0.1,1,10] [--wide] [--windows 4]
"""

import argparse
import statistics as stt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.models import parse_fleet  # noqa: E402
from makespan.planner.simulator import simulate  # noqa: E402
from planner_common import BENCH_POLICIES, TRACES, bench_fleet, select_window, window_jobs  # noqa: E402


def wide_fleet(gpus: int):
    """``bench_fleet`` with 8 set-point GPUs: m1..m6 on h0:0..5, t2 on h1:0–1."""
    base = bench_fleet(gpus)
    spec = base.model_dump(mode="json") if hasattr(base, "model_dump") else None
    if spec is None:
        raise SystemExit("--wide needs a pydantic fleet spec")
    for i, m in enumerate(("m1", "m2", "m3", "m4", "m5", "m6")):
        spec["endpoints"][m]["set_point"] = [{"host": "h0", "gpus": [i]}]
    spec["endpoints"]["t2"]["set_point"] = [{"host": "h1", "gpus": [0, 1]}]
    return parse_fleet(spec)


KEYS = (("weighted_completion_s", "weighted completion (s)"), ("set_point_absent_gpu_s", "set-point absent GPU-s"),
        ("restores", "restores"), ("cold", "cold starts"))


def _row(r: dict) -> dict:
    return {"weighted_completion_s": r["weighted_completion_s"], "set_point_absent_gpu_s": r["set_point_absent_gpu_s"],
            "restores": r["transitions"]["restore"], "cold": r["transitions"]["cold_start"], "wall": r["sim"]["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="portfolio", help="portfolio, or cpsat-fast (cpsat at 0.1 s per planning point)")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--windows", type=int, default=len(TRACES), help="first N of the 4 trace windows")
    ap.add_argument("--weights", default="0,0.1,1,10")
    ap.add_argument("--wide", action="store_true", help="8 set-point GPUs of 16 (module doc)")
    a = ap.parse_args()
    weights = [float(x) for x in a.weights.split(",")]
    if weights[0] != 0.0:
        raise SystemExit("the first weight must be 0 (the ratios' base)")
    fleet = wide_fleet(a.gpus) if a.wide else bench_fleet(a.gpus)
    sp_gpus = len(fleet.set_point_by_gpu())
    windows = [(path, select_window(path, bench_fleet(a.gpus), a.jobs, a.gpus)) for path in TRACES[:a.windows]]
    res: dict[float, list[dict]] = {w: [] for w in weights}
    for path, start in windows:
        for seed in range(a.seeds):
            jobs, _info = window_jobs(path, fleet, start, a.jobs, seed, a.gpus)
            for w in weights:
                r = _row(simulate(jobs, fleet, BENCH_POLICIES.lookup(a.policy), seed, set_point_weight=w))
                res[w].append(r)
                print(f"{Path(path).stem}@{start} seed={seed} w={w:g} wc={r['weighted_completion_s']:.5g} "
                      f"absent={r['set_point_absent_gpu_s']:.0f} restores={r['restores']} cold={r['cold']} "
                      f"wall={r['wall']:.1f}s", flush=True)
    n = len(res[0.0])
    print(f"\n{a.policy}, {a.jobs} jobs per window, {a.gpus} GPUs ({sp_gpus} at a set point), {len(windows)} windows "
          f"({', '.join(f'{Path(p).stem}@{s}' for p, s in windows)}) × {a.seeds} seeds = {n} replays; simulator "
          "defaults (scored preemption, restores planned at group). Mean over replays; ÷ w=0: mean of per-replay "
          "ratios to weight 0 [min, max] (a ratio only where weight 0 has a non-zero value)")
    print("| weight | " + " | ".join(f"{h} | ÷ w=0" for _k, h in KEYS) + " |")
    print("|---|" + "---|---|" * len(KEYS))
    for w in weights:
        cells = []
        for k, _h in KEYS:
            xs = [r[k] for r in res[w]]
            rat = [x / b[k] for x, b in zip(xs, res[0.0]) if b[k] > 0]
            cells.append(f"{stt.mean(xs):.4g} | {stt.mean(rat):.3f} [{min(rat):.3f}, {max(rat):.3f}]" if rat
                         else f"{stt.mean(xs):.4g} | –")
        print(f"| {w:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
