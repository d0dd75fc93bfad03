"""Where the time of the scale benchmark goes: one size of :mod:`bench.scale` with a
Redis command count per job and (when ``py-spy`` is installed) a sampled profile of the
planner and the GPU worker.

Run: ``.venv/bin/python -m bench.profile_scale --jobs 1000 [--batch-size 16] [--function] [--out DIR]``

It prints the bench row, Redis commands per job by command (``INFO commandstats``
between the start and the end of the measured run, warm-up excluded), the CPU seconds
per job of every process, and, per profiled process, the functions with the most
samples while holding the GIL (own and cumulative) from ``py-spy record --gil --format raw`` (``DIR/*.txt``).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

from makespan.keys import Keys
from makespan.live import delete_prefix
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings
from bench import scale

TOP = 25


def _commandstats(r) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def _gpu_time(r, keys) -> dict[str, float]:
    """Median ms of each stretch of a GPU slot's cycle, from the events stream: leased ->
    first phase_start (Celery publish, queue, worker pick-up), first phase_start ->
    completed (the phases), completed -> the next leased on that GPU (planner gap)."""
    from statistics import median

    from makespan.events import read_all

    leased: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, tuple[float, str]] = {}
    per_gpu: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for e in read_all(r, keys.events):
        lid = e.get("lease")
        if not lid or not e.get("job") or str(e.get("job")).startswith("restore"):
            continue
        if e["kind"] == "leased":
            leased[lid] = e["ts"]
            for g in e.get("gpus", []):
                per_gpu[g].append((e["ts"], "leased"))
        elif e["kind"] == "phase_start" and lid not in first:
            first[lid] = e["ts"]
        elif e["kind"] == "completed":
            done[lid] = (e["ts"], "")
            for g in e.get("gpus", []):
                per_gpu[g].append((e["ts"], "completed"))
    to_start = [first[lid] - t for lid, t in leased.items() if lid in first]
    run = [done[lid][0] - first[lid] for lid in first if lid in done]
    gap = []
    for evs in per_gpu.values():
        evs.sort()
        gap += [b[0] - a[0] for a, b in zip(evs, evs[1:]) if a[1] == "completed" and b[1] == "leased"]
    return {"leased_to_first_phase": 1000 * median(to_start) if to_start else 0.0,
            "phases": 1000 * median(run) if run else 0.0,
            "completed_to_next_lease": 1000 * median(gap) if gap else 0.0}


def _redis_cpu_s(r) -> float:
    c = r.info("cpu")
    return float(c["used_cpu_sys"]) + float(c["used_cpu_user"])


def _top(raw: Path, n: int = TOP) -> str:
    """Own and cumulative sample counts per function of a py-spy raw (collapsed) file."""
    own: collections.Counter = collections.Counter()
    cum: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        total += c
        frames = stack.split(";")
        own[frames[-1]] += c
        for f in set(frames):
            cum[f] += c
    out = [f"{raw.name}: {total} samples", "  own:"]
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(n)]
    out += ["  cumulative:"]
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in cum.most_common(n)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--function", action="store_true", help="the jobs call the no-op workload function (bench.scale's function mode)")
    ap.add_argument("--wall", action="store_true", help="py-spy samples every thread, not only the one holding the GIL")
    ap.add_argument("--no-spy", action="store_true", help="skip py-spy (it costs CPU on a small machine)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="profile-scale-")))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    pyspy = None if a.no_spy else shutil.which("py-spy") or (str(Path(scale.sys.executable).parent / "py-spy")
                                       if (Path(scale.sys.executable).parent / "py-spy").exists() else None)
    emb = start_embedded()
    r = connect(emb.url)
    spies: list[tuple[str, subprocess.Popen]] = []
    stats: dict[str, dict] = {}
    cpu: dict[str, tuple[float, float]] = {}
    orig_start, orig_stop = scale.Sampler.start, scale.Sampler.stop

    def start(self):
        stats["before"] = _commandstats(r)
        stats["redis_cpu0"] = _redis_cpu_s(r)
        stats["machine0"] = _machine_busy()
        cpu.update({n: (scale.cpu_s(p), 0.0) for n, p in self.pids.items()})
        cpu["bench"] = (scale.cpu_s(os.getpid()), 0.0)
        for name, pid in self.pids.items():
            if pyspy and name in ("planner", "gpu"):
                spies.append((name, subprocess.Popen(
                    [pyspy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--threads", *([] if a.wall else ["--gil"]),
                     "--output", str(a.out / f"{name}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        return orig_start(self)

    def stop(self):
        stats["gpu_time"] = _gpu_time(r, self.keys)
        solves = [x.split(":") for x in r.lrange(f"{self.keys.prefix}:planner:solve_s", 0, -1)]
        stats["plans"] = (len(solves), sum(float(t) for t, _ in solves), sum(int(n) for _, n in solves))
        stats["after"] = _commandstats(r)
        stats["redis_cpu1"] = _redis_cpu_s(r)
        stats["machine1"] = _machine_busy()
        cpu.update({n: (c0, scale.cpu_s(self.pids.get(n, os.getpid()))) for n, (c0, _) in cpu.items()})
        for _, sp in spies:
            sp.send_signal(signal.SIGINT)
        for _, sp in spies:
            sp.wait(timeout=60)
        return orig_stop(self)

    scale.Sampler.start, scale.Sampler.stop = start, stop
    try:
        prefix = f"bench-prof-{uuid.uuid4().hex[:8]}"
        s = Settings(redis_url=emb.url, key_prefix=prefix, time_scale=1e-4, lease_ttl_s=10.0, heartbeat_s=2.0,
                     batch_size=a.batch_size, planner_tick_s=0.02, retention_sweep_s=0.2, policy=a.policy)
        with tempfile.TemporaryDirectory(prefix="scale-") as d:
            raw = scale.run_raw_celery(replace(s, key_prefix=prefix + "-raw"), a.gpus, a.jobs, Path(d))
            delete_prefix(r, Keys(prefix + "-raw"))
            ours = scale.run_makespan(s, a.gpus, a.jobs, Path(d), function=a.function)
        ours["mode"] = "function" if a.function else "plain"  # the row's label (bench.scale's modes)
        ours["raw_celery_tasks_per_s"] = raw["tasks_per_s"]
        ours["ratio_to_raw"] = ours["jobs_per_s"] / raw["tasks_per_s"]
        ours["raw_celery_cpu_ms_per_task"] = raw["cpu_ms_per_task"]
        scale._print_row(ours)
        b, e = stats["before"], stats["after"]
        per = {k: (e.get(k, 0) - b.get(k, 0)) / a.jobs for k in e}
        print(f"Redis commands per job: {sum(per.values()):.1f}")
        for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
            if v >= 0.05:
                print(f"  {k:24s} {v:7.2f}")
        print("CPU ms per job: " + ", ".join(f"{n}={1000 * (c1 - c0) / a.jobs:.2f}" for n, (c0, c1) in cpu.items())
              + f", redis={1000 * (stats['redis_cpu1'] - stats['redis_cpu0']) / a.jobs:.2f}")
        print("GPU slot cycle, median ms: " + ", ".join(f"{k}={v:.1f}" for k, v in stats["gpu_time"].items()))
        n_plans, solve_s, planned = stats["plans"]
        print(f"plan() calls: {n_plans} ({a.jobs / max(1, n_plans):.1f} jobs started per call, "
              f"{planned / max(1, n_plans):.1f} jobs planned per call), plan() wall {1000 * solve_s / a.jobs:.2f} ms per job")
        (b0, t0), (b1, t1) = stats["machine0"], stats["machine1"]
        print(f"machine CPU busy during the run: {100 * (b1 - b0) / max(1, t1 - t0):.0f}% of {os.cpu_count()} CPUs "
              "(every process on the machine)")
        for name, _ in spies:
            print(_top(a.out / f"{name}.txt"))
        print(f"profiles in {a.out}")
    finally:
        scale.Sampler.start, scale.Sampler.stop = orig_start, orig_stop
        r.close()
        emb.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
