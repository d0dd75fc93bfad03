"""Cost of preemption decided inside the plan (planner/preemption_plan.py) on one batch.

A synthetic 256-job batch on 32 GPUs (``makespan.planner.synthetic.instance``, seed 1), its first 4
jobs made CRITICAL, every GPU held by a running LOW job (started 50 s ago, 1950 s left):
wall time of ``plan(batch, state, policy, preemption=False/True)`` (best of 2), and how
many preemptions the plan takes. The tardiness policy gets deadlines r + 3·p.

    .venv/bin/python bench/planner_preemption_cost.py [--policies portfolio,tardiness-portfolio]
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from makespan.planner.api import plan  # noqa: E402
from makespan.planner.model import PlanJob, RunningJob  # noqa: E402
from makespan.planner.synthetic import instance  # noqa: E402

RUN_S, RAN_S = 2000.0, 50.0  # running LOW jobs: service, and how long they have run


def busy_state(jobs: int = 256, gpus: int = 32, critical: int = 4):
    batch, state = instance(jobs, gpus, seed=1)
    now = state.now_s
    tp1 = next(e for e, m in state.endpoints.items() if m.tp == 1)
    running, free_at = {}, dict(state.free_at)
    for i, g in enumerate(state.gpus):
        ep = state.resident.get(g.uuid) or tp1
        job = PlanJob(f"run{i}", ep, 1.0, now - 2 * RAN_S, RUN_S, 3, seq=-1 - i)
        running[g.uuid] = RunningJob(job, (g.uuid,), now - RAN_S, now - RAN_S, now - RAN_S + RUN_S, True)
        free_at[g.uuid] = now - RAN_S + RUN_S
    batch = [dataclasses.replace(j, priority=0, weight=8.0) if k < critical else j for k, j in enumerate(batch)]
    return batch, dataclasses.replace(state, free_at=free_at, running=running)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="portfolio,tardiness-portfolio")
    a = ap.parse_args()
    batch, state = busy_state()
    print("| policy | without (s) | with scored preemption (s) | preemptions |")
    print("|---|---|---|---|")
    for pol in a.policies.split(","):
        bb = [dataclasses.replace(j, deadline_s=j.release_s + 3 * j.service_s) for j in batch] \
            if pol.startswith("tardiness") else batch
        cells = []
        for pre in (False, True):
            ts = []
            for _ in range(2):
                t0 = time.perf_counter()
                p = plan(bb, state, pol, preemption=pre)
                ts.append(time.perf_counter() - t0)
            cells.append(min(ts))
        print(f"| {pol} | {cells[0]:.3f} | {cells[1]:.3f} | {len(p.preemptions)} |")


if __name__ == "__main__":
    main()
