"""OR-Library wt40: how many of the 125 published optima the weighted-tardiness planner
reaches within a time limit per instance (default 10 s, 1 CP-SAT worker, seed 0).

Instance k of wt40.txt is integers [120k, 120k+120): 40 processing times, 40 weights,
40 due dates; wtopt40.txt holds the optimum (best known for instance 19, 1-based).
The solver (planner/tardiness.py) stops early once it reaches the published value or
proves optimality. Prints one line per instance and the totals; ``--subset`` runs every
k-th instance (a documented subset when the machine is loaded).

    .venv/bin/python bench/planner_orlib.py [--limit-s 10] [--subset 1] [--workers 1]

``--policy tardiness`` runs the multi-GPU policy instead (planner/tardiness_policy.py) on
a fleet of one GPU holding the instance's one endpoint, jobs released at 0: same
numbers, but no early stop at the published value (it uses its whole limit unless the
tardiness is 0) and no proof; "heuristic" is then its greedy floor.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from makespan.planner.model import EndpointModel, FleetState, Gpu, PlanJob  # noqa: E402
from makespan.planner.tardiness import WtResult, solve_single_machine  # noqa: E402
from makespan.planner.tardiness_policy import tardiness_policy  # noqa: E402
from makespan.traces import traces_dir  # noqa: E402

DIR = traces_dir() / "orlib-wt"


def load(n: int = 40) -> tuple[list[tuple[list[int], list[int], list[int]]], list[int]]:
    """(instances as (p, w, d), optima) of wt{n}."""
    nums = [int(x) for x in (DIR / f"wt{n}.txt").read_text().split()]
    opt = [int(x) for x in (DIR / f"wtopt{n}.txt").read_text().split()]
    inst = []
    for k in range(len(nums) // (3 * n)):
        b = nums[3 * n * k:3 * n * (k + 1)]
        inst.append((b[:n], b[n:2 * n], b[2 * n:]))
    return inst, opt


def fleet_policy(p, w, d, limit_s: float) -> WtResult:
    """The instance through policy ``tardiness`` on one warm GPU (module doc)."""
    st = FleetState(0.0, [Gpu("g0", "h", 0, 80_000)], {"e": EndpointModel("e", 1, 1000, 60.0, 5.0)},
                    resident={"g0": "e"})
    batch = [PlanJob(f"j{i}", "e", float(w[i]), 0.0, float(p[i]), deadline_s=float(d[i]), seq=i)
             for i in range(len(p))]
    t0 = time.perf_counter()
    got = tardiness_policy(batch, st, time_limit_s=limit_s)
    order = [int(a.job_id[1:]) for a in got.assignments]
    return WtResult(order, got.objective, got.stats["floor_objective"], got.stats["proven_optimal"] == 1.0,
                    time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-s", type=float, default=10.0)
    ap.add_argument("--subset", type=int, default=1, help="every k-th instance")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--instances", default=None, help="comma-separated 1-based instance numbers")
    ap.add_argument("--policy", default="single-machine", choices=("single-machine", "tardiness"))
    a = ap.parse_args()
    inst, opt = load(a.n)
    idx = list(range(0, len(inst), a.subset))
    if a.instances:
        idx = [int(x) - 1 for x in a.instances.split(",")]
    hit = heur_hit = 0
    gaps, walls = [], []
    t0 = time.perf_counter()
    for k in idx:
        p, w, d = inst[k]
        if a.policy == "tardiness":
            r = fleet_policy(p, w, d, a.limit_s)
        else:
            r = solve_single_machine(p, w, d, time_limit_s=a.limit_s, seed=0, workers=a.workers, target=opt[k])
        ok = r.value <= opt[k]
        hit += ok
        heur_hit += r.heuristic_value <= opt[k]
        gap = 0.0 if opt[k] == 0 else 100 * (r.value - opt[k]) / opt[k]
        gaps.append(gap)
        walls.append(r.wall_s)
        print(f"wt{a.n} #{k + 1:3d} opt={opt[k]:7d} found={r.value:9.0f} heuristic={r.heuristic_value:9.0f} "
              f"gap={gap:6.2f}% {'OPT' if ok else '   '} proved={int(r.optimal)} wall={r.wall_s:5.2f}s", flush=True)
    print(f"\nwt{a.n}: {hit}/{len(idx)} published optima reached within {a.limit_s:g} s each "
          f"({heur_hit}/{len(idx)} by {'the greedy floor' if a.policy == 'tardiness' else 'the rules + local search'} "
          f"alone); mean gap {sum(gaps) / len(gaps):.3f}%, "
          f"max gap {max(gaps):.2f}%; mean wall {sum(walls) / len(walls):.2f} s; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
