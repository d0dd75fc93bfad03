"""The greedy portfolio's CPU time, this checkout against another (e.g. main's), in one run.

Issue 21 (a) compares ticks as the fleet grows; this bench compares two versions of the
planner code on the same batches of ``bench/planner_fleet_scale.py`` (the ITP windows of
``bench/planner_cpsat.py``, times ÷ 20, on :func:`planner_common.bench_fleet`). One worker
process per checkout, each importing its own ``makespan`` (the interpreter of that
checkout's virtual environment); the driver alternates them batch by batch, so both see
the same machine load, and repeats every batch ``--rounds`` times. A worker reports the
portfolio's process CPU time and wall time per batch (ms) and a SHA-256 of its plan
(assignments and stats), so the plans of the two checkouts are compared batch by batch.

    .venv/bin/python bench/portfolio_ab.py --old /work/other-checkout [--old-python PATH]
        [--sizes 256x32,256x1024] [--seeds 2] [--rounds 3]

Prints one table row per size: CPU p50 / p95 old and new, wall p50 old and new, old ÷ new
(CPU p50), new ÷ new at the first size (CPU p50), and identical plans (batches whose
digests agree, of all batches run). ``--worker`` is the worker's own mode (internal).
"""

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(seeds: int, sizes: list[tuple[int, int]]) -> None:
    """Read "SIZE_INDEX BATCH_INDEX" lines on stdin, plan that batch, print a JSON line."""
    sys.path.insert(0, str(Path.cwd()))
    sys.path.insert(0, str(Path.cwd() / "bench"))
    from makespan.planner.greedy import portfolio
    from makespan.planner.simulator import fleet_state, to_plan_jobs
    from makespan.traces import read_trace
    from planner_common import bench_fleet
    from planner_cpsat import WINDOWS

    cases = []
    for n_jobs, n_gpus in sizes:
        fleet = bench_fleet(n_gpus)
        state = fleet_state(fleet)
        batches = [to_plan_jobs(read_trace(path, fleet, seed=seed, start=start, limit=n_jobs), 20.0)
                   for path, start in WINDOWS for seed in range(seeds)]
        portfolio(batches[0], state)  # warm caches (fleet layout, aligned groups)
        cases.append((state, batches))
    print(json.dumps({"ready": [len(b) for _, b in cases]}), flush=True)
    for line in sys.stdin:
        size_i, batch_i = map(int, line.split())
        state, batches = cases[size_i]
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        plan = portfolio(batches[batch_i], state)
        cpu_ms = (time.process_time() - cpu_start) * 1000
        wall_ms = (time.perf_counter() - wall_start) * 1000
        key = [(a.job_id, a.gpus, a.start_s, a.end_s, a.load, a.evicts) for a in plan.assignments]
        digest = hashlib.sha256(repr((key, sorted(plan.stats.items()))).encode()).hexdigest()[:16]
        print(json.dumps({"cpu_ms": cpu_ms, "wall_ms": wall_ms, "digest": digest}), flush=True)


def _start(checkout: Path, python: str, argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([python, str(HERE / "portfolio_ab.py"), "--worker", *argv], cwd=checkout,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    return proc


def _ask(proc: subprocess.Popen, size_i: int, batch_i: int) -> dict:
    proc.stdin.write(f"{size_i} {batch_i}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    return json.loads(proc.stdout.readline())  # type: ignore[union-attr]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the other checkout (its .venv/bin/python runs its code)")
    ap.add_argument("--old-python", help="the interpreter that imports the other checkout's makespan "
                    "(default: OLD/.venv/bin/python)")
    ap.add_argument("--sizes", default="256x32,256x1024,1024x1024", help="JOBSxGPUS,... (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=2, help="mappings per window (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="times each batch is planned by each (default: %(default)s)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    if args.worker:
        worker(args.seeds, sizes)  # type: ignore[arg-type]
        return
    if not args.old:
        ap.error("--old is required")
    argv = ["--sizes", args.sizes, "--seeds", str(args.seeds)]
    old_root = Path(args.old).resolve()
    old = _start(old_root, args.old_python or str(old_root / ".venv" / "bin" / "python"), argv)
    new = _start(HERE.parent, sys.executable, argv)
    print(f"old: {Path(args.old).resolve()}  new: {HERE.parent}  {args.seeds} mapping(s) x 3 windows, "
          f"{args.rounds} round(s), alternating; ms\n")
    print("| jobs / GPUs | CPU p50 old / new | CPU p95 old / new | wall p50 old / new | old ÷ new (CPU p50) "
          "| new ÷ new at first size (CPU p50) | identical plans |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for size_i, (n_jobs, n_gpus) in enumerate(sizes):
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        same = total = 0
        for round_i in range(args.rounds):
            for batch_i in range(3 * args.seeds):
                pair = [("old", old), ("new", new)] if (round_i + batch_i) % 2 == 0 else [("new", new), ("old", old)]
                got = {name: _ask(proc, size_i, batch_i) for name, proc in pair}
                for name, r in got.items():
                    runs[name].append(r)
                same += got["old"]["digest"] == got["new"]["digest"]
                total += 1
        cpu = {k: [r["cpu_ms"] for r in v] for k, v in runs.items()}
        wall = {k: [r["wall_ms"] for r in v] for k, v in runs.items()}
        new50 = _p(cpu["new"], 50)
        base = base or new50
        print(f"| {n_jobs} / {n_gpus} | {_p(cpu['old'], 50):.0f} / {new50:.0f} "
              f"| {_p(cpu['old'], 95):.0f} / {_p(cpu['new'], 95):.0f} "
              f"| {_p(wall['old'], 50):.0f} / {_p(wall['new'], 50):.0f} | {_p(cpu['old'], 50) / new50:.2f} "
              f"| {new50 / base:.2f} | {same}/{total} |", flush=True)
    for proc in (old, new):
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait()


if __name__ == "__main__":
    main()
