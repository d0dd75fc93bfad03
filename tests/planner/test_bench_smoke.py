"""The planner benchmarks run end to end on tiny settings (real trace windows): they call
the planner's public API, so an API change that breaks them fails here, not in a
benchmark run hours later. Figures are not checked (benchmarks are not timed tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "scale": (["bench/planner_scale.py", "--sizes", "200", "--skip-latency"], "| jobs | planning points"),
    "policies": (["bench/planner_policies.py", "--seeds", "1", "--policies", "fifo,portfolio"],
                 "| policy | weighted completion"),
    "policies-plan": (["bench/planner_policies.py", "--seeds", "1", "--policies", "fifo,portfolio",
                       "--plan-preemption"], "| portfolio@plan |"),
    "preemption-cost": (["bench/planner_preemption_cost.py", "--policies", "portfolio"], "| portfolio |"),
    "cpsat": (["bench/planner_cpsat.py", "--limits", "0.05", "--seeds", "1"], "| jobs | GPUs | limit"),
    "set-point": (["bench/planner_set_point.py", "--seeds", "1", "--windows", "1", "--weights", "0,1", "--wide"],
                  "| weight | weighted completion"),
    "fleet-scale": (["bench/planner_fleet_scale.py", "--seeds", "1", "--default-seeds", "0", "--sizes", "64x16,64x32"],
                    "| jobs / GPUs | portfolio old"),
    "portfolio-ab": (["bench/portfolio_ab.py", "--old", ".", "--old-python", sys.executable, "--seeds", "1",
                      "--rounds", "1", "--sizes", "64x16"], "| jobs / GPUs | CPU p50 old / new"),
    "tardiness": (["bench/planner_tardiness.py", "--seeds", "1", "--policies", "fifo,tardiness-portfolio",
                   "--static-limit-s", "0.05"], "tardiness"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_planner_benchmark_runs(name, traces):
    args, header = CASES[name]
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert header in out.stdout, out.stdout[-2000:]
