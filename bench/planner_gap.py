"""Where a policy loses weighted completion against the transition-free reference.

For each benchmark window (``bench/planner_common.py``) and seed, replays the policies
and ``free-wspt`` (``wspt`` on the same fleet with every cold start and evict set to 0:
an optimistic reference, not a bound) in the simulator and prints, per replay:
weighted completion, makespan, cold starts, utilization, idle and idle-while-queued
GPU-seconds, transition GPU-seconds; per weight class w·wait (start − submit), w·transition
and the job count; cold starts per sixth of the replay's makespan (by start); and
w·(wait + transition) per sixth of the window's arrival span (by submission, the same bins
for every policy), which locates the loss in time (the ramp from a nearly empty fleet, or
later).

    .venv/bin/python bench/planner_gap.py [--policies fifo,portfolio] [--windows 0,1,2,3] [--seeds 0]
        [--no-preemption] [--no-restore]

Records are the simulator's final job records (``detail=True``): a preempted job counts
once, with its last attempt.
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from makespan.planner.measures import JobRecord  # noqa: E402
from makespan.planner.model import FleetState  # noqa: E402
from makespan.planner.simulator import fleet_state, simulate  # noqa: E402
from planner_common import TRACES, bench_fleet, select_window, window_jobs  # noqa: E402

SIXTHS = 6


def _free_fleet(fleet):
    base = fleet_state(fleet)
    eps = {n: replace(e, cold_start_s=0.0, evict_s=0.0, wake_s=None) for n, e in base.endpoints.items()}
    return FleetState(0.0, base.gpus, eps, resident=dict(base.resident), set_point=base.set_point)


def _summary(name: str, rep: dict, recs: list, span_s: float) -> None:
    mk = rep["makespan_s"]
    per_w: dict[float, list[float]] = {}
    cold = [0] * SIXTHS
    lost = [0.0] * SIXTHS
    for r in recs:
        d = per_w.setdefault(r.weight, [0.0, 0.0, 0])
        d[0] += r.weight * (r.start_s - r.submit_s)
        d[1] += r.weight * (r.service_start_s - r.start_s)
        d[2] += 1
        if r.load != "warm":
            cold[min(SIXTHS - 1, int(SIXTHS * r.start_s / mk))] += 1
        lost[min(SIXTHS - 1, int(SIXTHS * r.submit_s / span_s))] += r.weight * (r.service_start_s - r.submit_s)
    print(f"  {name:10s} wc={rep['weighted_completion_s']:.4g} mk={mk:.0f} cold={rep['transitions']['cold_start']} "
          f"util={rep['utilization']:.2f} idle={rep['idle_gpu_s']:.0f} idle_while_queued="
          f"{rep['idle_while_queued_gpu_s']:.0f} transition_gpu_s={rep['transition_gpu_s']:.0f}")
    print("    w·wait / w·transition / jobs: " + "; ".join(
        f"w{w:g}: {d[0]:.3g} / {d[1]:.3g} / {d[2]}" for w, d in sorted(per_w.items(), reverse=True)))
    print(f"    cold starts per sixth (by start): {cold}; w·(wait+transition) per sixth of the arrival span: "
          + " ".join(f"{v:.3g}" for v in lost))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="fifo,portfolio")
    ap.add_argument("--windows", default="0,1,2,3", help="indices into planner_common.TRACES")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--no-preemption", action="store_true")
    ap.add_argument("--no-restore", action="store_true")
    a = ap.parse_args()
    fleet = bench_fleet(a.gpus)
    free = _free_fleet(fleet)
    for wi in (int(x) for x in a.windows.split(",")):
        path = TRACES[wi]
        start = select_window(path, fleet, a.jobs, a.gpus)
        for seed in (int(x) for x in a.seeds.split(",")):
            jobs, _ = window_jobs(path, fleet, start, a.jobs, seed, a.gpus)
            print(f"== {Path(path).stem}@{start} seed {seed}: Σ w·p = {sum(j.weight * j.service_s for j in jobs):.4g}")
            for p in a.policies.split(",") + ["free-wspt"]:
                rep = simulate(jobs, free if p == "free-wspt" else fleet, "wspt" if p == "free-wspt" else p, seed,
                               preemption=not a.no_preemption, restore=not a.no_restore, detail=True)
                recs = [JobRecord(**r) for r in rep["schedule"]["jobs"]]
                _summary(p, rep, recs, max(j.release_s for j in jobs) or 1.0)


if __name__ == "__main__":
    main()
