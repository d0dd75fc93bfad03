"""What the fast lane adds to a planning tick as the fleet grows (issue 21 with issue 19's lane).

The live tick enforces the fast lane on the plan of its batch (workers/tick/steps.py,
:func:`makespan.planner.fast_lane.enforce`). Batches are the ITP windows of
``bench/planner_cpsat.py`` (times ÷ 20, all queued at once) on the benchmark fleet of
:mod:`planner_common`, as in ``bench/planner_fleet_scale.py``; each batch's portfolio plan is
enforced with

    * the CRITICAL-only lane (the default before 2026-12-03) and the default lane
      (CRITICAL, HIGH × 1.25 with its peer floor), each
    * on the placement index (``indexed``) and with every group scanned
      (``full``: :func:`makespan.planner.placement_index.full_scan`), in the same process.

Prints per size and lane the wall ms median / max over the batches, full ÷ indexed, and
whether the two give the same plan (they must).

A second table times the lane's rule preemptions (:func:`makespan.planner.fast_lane.rule_preemptions`,
which the live tick's preemption step runs before the scored decision) on a **full** fleet:
every GPU held by a running LOW job (1 GPU each, started 100 s ago, ending 2,000 s from
now: no group frees within a cold start, so strict priority's rule preempts for every
CRITICAL/HIGH job past its allowed start), the same batches all released. Per size and lane:
wall ms median / max, and the preemptions taken (median / max). ``--no-preempt`` skips it.

    .venv/bin/python bench/lane_cost.py [--sizes 256x32,256x1024,1024x1024] [--seeds 1] [--no-preempt]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dataclasses import replace  # noqa: E402

from makespan.planner import fast_lane, placement_index, preemption_plan  # noqa: E402
from makespan.planner.model import PlanJob, RunningJob  # noqa: E402
from makespan.planner.greedy import portfolio  # noqa: E402
from makespan.planner.simulator import fleet_state, to_plan_jobs  # noqa: E402
from makespan.traces import read_trace  # noqa: E402
from planner_common import bench_fleet  # noqa: E402
from planner_cpsat import WINDOWS  # noqa: E402

LANES = {"CRITICAL only": ({0: 1.0}, {0: 30.0}),
         "default": (fast_lane.DEFAULT_LANE_LEVELS, fast_lane.DEFAULT_START_GRACE)}


def _sizes(a):
    """(jobs, GPUs, the fleet's state at its set point, the batches) per ``--sizes`` entry."""
    for size in a.sizes.split(","):
        n, gpus = (int(x) for x in size.split("x"))
        fleet = bench_fleet(gpus)
        batches = [to_plan_jobs(read_trace(path, fleet, seed=seed, start=start, limit=n), 20.0)
                   for path, start in WINDOWS for seed in range(a.seeds)]
        yield n, gpus, fleet_state(fleet), batches


def _key(p):
    return [(a.job_id, a.gpus, a.start_s, a.end_s, a.load) for a in p.assignments]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256x32,256x1024,1024x1024", help="JOBSxGPUS,...")
    ap.add_argument("--seeds", type=int, default=1, help="trace mappings per window")
    ap.add_argument("--no-preempt", action="store_true", help="skip the rule-preemption table")
    a = ap.parse_args()
    print("| jobs / GPUs | lane | indexed ms (median / max) | full scan ms (median / max) | full ÷ indexed | same plans |")
    print("|---|---|---|---|---|---|")
    for n, gpus, state, batches in _sizes(a):
        plans = [portfolio(b, state) for b in batches]
        for name, (levels, grace) in LANES.items():
            times: dict[str, list[float]] = {"indexed": [], "full": []}
            same = 0
            for batch, p in zip(batches, plans):
                t = time.perf_counter()
                got, _ = fast_lane.enforce(p, batch, state, levels, start_grace_s=grace)
                times["indexed"].append((time.perf_counter() - t) * 1000)
                with placement_index.full_scan():
                    t = time.perf_counter()
                    want, _ = fast_lane.enforce(p, batch, state, levels, start_grace_s=grace)
                    times["full"].append((time.perf_counter() - t) * 1000)
                same += _key(got) == _key(want)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {n} / {gpus} | {name} | {med['indexed']:.0f} / {max(times['indexed']):.0f} | "
                  f"{med['full']:.0f} / {max(times['full']):.0f} | {med['full'] / max(med['indexed'], 1e-9):.1f} | "
                  f"{same}/{len(batches)} |")

    if not a.no_preempt:
        _preempt_table(a)


def _full_fleet(state, batch):
    """``state`` at the batch's last release with every GPU held by a running LOW job (module doc)."""
    now = max(j.release_s for j in batch) + 1.0
    running = {}
    for n, gpu in enumerate(state.gpus):
        job = PlanJob(f"low-{n}", "m1", 1.0, now - 100.0, 2100.0, 3, seq=-1 - n)
        running[gpu.uuid] = RunningJob(job, (gpu.uuid,), now - 100.0, now - 55.0, now + 2000.0)
    return replace(state, now_s=now, free_at={g.uuid: now + 2000.0 for g in state.gpus},
                   resident={g.uuid: "m1" for g in state.gpus}, running=running)


def _preempt_table(a) -> None:
    print("\nRule preemptions on a full fleet (every GPU held by a LOW job)")
    print("| jobs / GPUs | lane | CRITICAL+HIGH jobs (median) | rule_preemptions ms (median / max) "
          "| preemptions taken (median / max) |")
    print("|---|---|---|---|---|")
    for n, gpus, state, batches in _sizes(a):
        for name, (levels, grace) in LANES.items():
            times, taken, urgent = [], [], []
            for batch in batches:
                full = _full_fleet(state, batch)
                t = time.perf_counter()
                out = fast_lane.rule_preemptions(preemption_plan.Branch(full, list(batch), None, [], [], []),
                                                 levels, grace)
                times.append((time.perf_counter() - t) * 1000)
                taken.append(len(out.taken))
                urgent.append(sum(j.priority <= 1 for j in batch))
            print(f"| {n} / {gpus} | {name} | {statistics.median(urgent):.0f} | {statistics.median(times):.0f} / "
                  f"{max(times):.0f} | {statistics.median(taken):.0f} / {max(taken)} |")


if __name__ == "__main__":
    main()
