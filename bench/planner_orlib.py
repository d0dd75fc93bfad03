"""OR-Library wt40: how many of the 125 published optima the weighted-tardiness planner
reaches within a time limit per instance (default 10 s, 1 CP-SAT worker, seed 0).

Instance k of wt40.txt is integers [120k, 120k+120): 40 processing times, 40 weights,
40 due dates; wtopt40.txt holds the optimum (best known for instance 19, 1-based).
The solver (planner/tardiness.py) stops early once it reaches the published value or
proves optimality. Prints one line per instance and the totals; ``--subset`` runs every
k-th instance (a documented subset when the machine is loaded).

    .venv/bin/python bench/planner_orlib.py [--limit-s 10] [--subset 1] [--workers 1]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.tardiness import solve_single_machine  # noqa: E402
from app.traces import traces_dir

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-s", type=float, default=10.0)
    ap.add_argument("--subset", type=int, default=1, help="every k-th instance")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--instances", default=None, help="comma-separated 1-based instance numbers")
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
          f"({heur_hit}/{len(idx)} by the rules + local search alone); mean gap {sum(gaps) / len(gaps):.3f}%, "
          f"max gap {max(gaps):.2f}%; mean wall {sum(walls) / len(walls):.2f} s; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
