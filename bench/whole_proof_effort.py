"""How long the whole-batch CP-SAT proof takes, in work and in wall time (issue 17 point 7).

The regression test ``tests/faults/test_remaining_cases.py::test_same_30_job_batch_with_1_and_8_solver_workers``
bounds this solve by CP-SAT's deterministic time (its count of work), because a wall-time
limit made the test's outcome depend on the machine's load. The speed figure the test
used to assume ("proves well under the 2 s limit on 2 cores") is measured here instead:
for each requested worker count, the deterministic time and the wall time each run took
to prove the optimum, with the host's load average beside them.

    .venv/bin/python bench/whole_proof_effort.py [--runs 5] [--workers 1,8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ortools.sat.python import cp_model

from makespan.planner import whole
from makespan.planner.greedy import portfolio
from makespan.planner.synthetic import instance


def measure(runs: int, workers: int) -> list[tuple[float, float, bool]]:
    """``runs`` solves of the test's batch with ``workers`` requested search workers:
    (deterministic s, wall s, proven optimal) per run."""
    batch, state = instance(30, 8, models=3, seed=1, spread_s=8000.0, gang=False)
    state.free_at.update({state.gpus[0].uuid: 500.0, state.gpus[7].uuid: 300.0})
    floor = portfolio(batch, state)
    out = []
    solve = cp_model.CpSolver.Solve
    seen: dict[str, float] = {}

    def recording_solve(solver: cp_model.CpSolver, model: cp_model.CpModel, *args):
        status = solve(solver, model, *args)
        seen["deterministic_s"] = solver.ResponseProto().deterministic_time
        return status

    cp_model.CpSolver.Solve = recording_solve  # type: ignore[method-assign]
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            plan = whole.solve(batch, state, floor, time_limit_s=120.0, workers=workers)
            wall_s = time.perf_counter() - t0
            proven = plan is not None and plan.stats["proven_optimal"] == 1.0
            out.append((seen["deterministic_s"], wall_s, proven))
    finally:
        cp_model.CpSolver.Solve = solve  # type: ignore[method-assign]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", default="1,8", help="comma-separated requested worker counts")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")
    print("| requested workers | used | proven runs | deterministic s (median / max) | wall s (median / max) |")
    print("|---|---|---|---|---|")
    for workers in (int(x) for x in args.workers.split(",")):
        rows = measure(args.runs, workers)
        det = [row[0] for row in rows]
        wall = [row[1] for row in rows]
        print(f"| {workers} | {whole.search_workers(workers)} | {sum(row[2] for row in rows)}/{len(rows)} | "
              f"{statistics.median(det):.3f} / {max(det):.3f} | {statistics.median(wall):.2f} / {max(wall):.2f} |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
