"""Issue 21 bench (c): two pools × 256 simulated GPUs against one pool of 512.

Run: ``nice -n 5 .venv/bin/python -m bench.pools [--jobs 2000] [--tick-jobs 512] [--reps 3] [--policy portfolio]``
(a private redis-server is started unless ``--redis-url`` is given).

The fleet: 8 hosts × 64 simulated GPUs (512), four TP-1 endpoints with a set point on every
GPU. Layout ``one``: no pools, one planner for the 512 GPUs. Layout ``two``: pools ``a``
(hosts h0–h3, endpoints e0, e1) and ``b`` (h4–h7, e2, e3), one planner each. Jobs are spread
evenly over the four endpoints, so each pool gets half of them.

1. **Tick** (in-process, dispatch captured, no GPU worker): ``--tick-jobs`` jobs queued, then
   each planner ticks until its queues are empty (every job planned and leased, at most
   ``batch_size`` a tick, on an idle fleet): wall and CPU ms (``time.process_time``) of those
   ticks, ``--reps`` repetitions on fresh keys. For ``two`` the pools tick one after the other
   in this process (in a deployment they run in parallel, each in its own process, so the
   slowest pool bounds the time to plan everything).
2. **Live** (real processes: one GPU worker per host, 64 threads each, the planners, one Redis
   and one Celery): ``--jobs`` no-op jobs submitted while the fleet drains them; jobs/s from
   the first submit to the last finish, the planners' solve times (``P:…:planner:solve_s``,
   p50/p95) and CPU ms per job (all planner processes together), and the lost and duplicated
   jobs from the event stream (one ``completed`` event and one execute phase per job).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from makespan import events as ev
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import FleetSpec, load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings
from makespan.workers.planner_worker import PlannerWorker
from bench.scale import cpu_s

HOSTS = 8
GPUS_PER_HOST = 64
ENDPOINTS = ("e0", "e1", "e2", "e3")


def fleet_toml(pools: bool) -> str:
    """The bench fleet (module doc); ``pools``: split into pools a and b."""
    out = ['name = "pools-bench"']
    for h in range(HOSTS):
        out += ["[[hosts]]", f'name = "h{h}"', f"gpu_count = {GPUS_PER_HOST}", "memory_mib = 81920"]
    for i, name in enumerate(ENDPOINTS):
        hosts = range(HOSTS // 2) if i < 2 else range(HOSTS // 2, HOSTS)
        # each endpoint's set point: half the GPUs of its half of the fleet (e0: even GPUs of h0-h3, ...)
        sp = ", ".join(f'{{ host = "h{h}", gpus = [{g}] }}' for h in hosts for g in range(i % 2, GPUS_PER_HOST, 2))
        out += [f"[endpoints.{name}]", f'model = "noop/{name}"', "memory_mib_per_gpu = 1000", "cold_start_s = 1",
                "evict_s = 0", f"set_point = [{sp}]"]
    if pools:
        half = HOSTS // 2
        out += ["[[pools]]", 'name = "a"', f"hosts = {[f'h{h}' for h in range(half)]}".replace("'", '"'),
                'endpoints = ["e0", "e1"]',
                "[[pools]]", 'name = "b"', f"hosts = {[f'h{h}' for h in range(half, HOSTS)]}".replace("'", '"'),
                'endpoints = ["e2", "e3"]']
    return "\n".join(out) + "\n"


def _submit(prod: Producer, n: int, errors: list, service_s: float = 0.01) -> None:
    try:
        for i in range(n):
            prod.submit({"endpoint": ENDPOINTS[i % len(ENDPOINTS)], "service_s": service_s})
    except Exception as e:  # reported by the caller
        errors.append(e)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- 1. the tick, in-process -----------------------------------------------------------------
def tick_times(url: str, fleet: FleetSpec, settings: Settings, n_jobs: int,
               reps: int) -> dict[str, list[tuple[float, float, int]]]:
    """Per planner (pool name, or ``all`` without pools), ``reps`` times on fresh keys: (wall
    ms, CPU ms, ticks) of the ticks it takes until its queues are empty (every queued job
    leased: at most ``batch_size`` a tick)."""
    out: dict[str, list[tuple[float, float, int]]] = {}
    for _ in range(reps):
        s = dataclasses.replace(settings, key_prefix=f"bench-pools-tick-{uuid.uuid4().hex[:8]}")
        r = connect(url)
        keys = Keys(s.key_prefix)
        try:
            planners = {pool or "all": PlannerWorker(r, s, fleet, dispatch=lambda ctx, q: None, pool=pool)
                        for pool in (fleet.pool_names() or [None])}
            _submit(Producer(r, keys, fleet, s), n_jobs, [])
            for name, worker in planners.items():
                worker.token = ""
                wall_ms = cpu_ms = 0.0
                ticks = 0
                while ticks < 10 and sum(r.zcard(q) for q in worker.keys.queues()):
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    worker.tick()
                    wall_ms += 1000 * (time.perf_counter() - wall0)
                    cpu_ms += 1000 * (time.process_time() - cpu0)
                    ticks += 1
                out.setdefault(name, []).append((wall_ms, cpu_ms, ticks))
                worker.close()
        finally:
            delete_prefix(r, keys)
            r.close()
    return out


# -- 2. live ------------------------------------------------------------------------------------
def live_run(settings: Settings, fleet_path: Path, n_jobs: int, workdir: Path) -> dict[str, Any]:
    """Drain ``n_jobs`` no-op jobs through the live system (module doc, 2)."""
    fleet = load_fleet(fleet_path)
    r = connect(settings.redis_url)
    keys = Keys(settings.key_prefix)
    live = LiveSystem(fleet_path, fleet, settings, workdir / "logs", observer=False)
    live.start(wait_s=300)
    try:
        scopes = [keys.for_pool(pool) for pool in fleet.pool_names()] or [keys]
        wait_for(lambda: all(r.hget(scope.drain, "checks") for scope in scopes), 300,
                 "set points restored and a first drain check")
        planners = [p.popen.pid for p in live.procs if p.name.startswith("planner-")]
        prod = Producer(r, keys, fleet, settings)
        for scope in scopes:
            r.delete(scope.planner_solve_times)
        cpu0 = sum(cpu_s(pid) for pid in planners)
        errors: list = []
        t0 = time.time()
        th = threading.Thread(target=_submit, args=(prod, n_jobs, errors), daemon=True)
        th.start()
        th.join()
        if errors:
            raise errors[0]
        events = lambda: list(ev.read_all(r, keys.events))  # noqa: E731

        def finished() -> int:
            return sum(1 for e in events() if e["kind"] in ("completed", "failed", "cancelled") and e.get("job"))

        wait_for(lambda: finished() >= n_jobs, 3600, f"{n_jobs} jobs to finish", poll_s=1.0)
        evs = events()
        last = max(e["ts"] for e in evs if e["kind"] == "completed")
        cpu1 = sum(cpu_s(pid) for pid in planners)
        submitted = [e["job"] for e in evs if e["kind"] == "submitted"]
        done = Counter(e["job"] for e in evs if e["kind"] == "completed" and e.get("job"))
        execd = Counter(e["job"] for e in evs if e["kind"] == "phase_end" and e.get("phase") == "execute")
        solve = [float(x.split(":")[0]) for scope in scopes for x in r.lrange(scope.planner_solve_times, 0, -1)]
        host_of = {e["job"]: e.get("host") for e in evs if e["kind"] == "phase_end" and e.get("phase") == "execute"}
        by_pool = Counter(fleet.pool_of_host(host_of[j]) or "all" for j in submitted if host_of.get(j))
        return {
            "jobs": n_jobs, "elapsed_s": last - t0, "jobs_per_s": n_jobs / (last - t0),
            "lost": sum(1 for j in submitted if done[j] == 0),
            "duplicated": sum(1 for j in submitted if done[j] > 1 or execd[j] > 1),
            "solve_ms_p50": 1000 * _pct(solve, 0.5), "solve_ms_p95": 1000 * _pct(solve, 0.95), "solves": len(solve),
            "planner_cpu_ms_per_job": 1000 * (cpu1 - cpu0) / n_jobs, "by_pool": dict(by_pool),
        }
    finally:
        live.stop()
        r.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="live jobs per layout")
    ap.add_argument("--tick-jobs", type=int, default=512, help="jobs queued before the measured tick")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policy", default="portfolio")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--redis-url", default=None, help="default: a private embedded redis-server")
    a = ap.parse_args(argv)
    emb = None
    url = a.redis_url
    if url is None:
        emb = start_embedded()
        url = emb.url
    try:
        base = Settings(redis_url=url, key_prefix="bench-pools", time_scale=1e-4, lease_ttl_s=10.0, heartbeat_s=2.0,
                        batch_size=a.batch_size, planner_tick_s=0.02, retention_sweep_s=0.2, policy=a.policy)
        with tempfile.TemporaryDirectory(prefix="pools-") as d:
            for layout in ("one", "two"):
                path = Path(d) / f"{layout}.toml"
                path.write_text(fleet_toml(layout == "two"))
                fleet = load_fleet(path)
                ticks = tick_times(url, fleet, base, a.tick_jobs, a.reps)
                for name, rows in ticks.items():
                    gpus = len(fleet.pool_fleet(name).gpu_uuids()) if fleet.pools else fleet.gpu_count()
                    wall, cpu = [row[0] for row in rows], [row[1] for row in rows]
                    print(f"tick {layout} {name}: {gpus} GPUs, {a.tick_jobs} queued in all, until its queue is "
                          f"empty ({rows[0][2]} ticks): wall median {statistics.median(wall):.0f} ms, max "
                          f"{max(wall):.0f}; CPU median {statistics.median(cpu):.0f} ms, max {max(cpu):.0f} "
                          f"(wall {', '.join(f'{x:.0f}' for x in wall)}; CPU {', '.join(f'{x:.0f}' for x in cpu)})",
                          flush=True)
                if len(ticks) > 1:  # pools plan in parallel (own processes): the slowest one bounds the wall time
                    slowest = [max(col) for col in zip(*([row[1] for row in rows] for rows in ticks.values()))]
                    print(f"tick {layout} slowest pool's CPU ms, median {statistics.median(slowest):.0f}", flush=True)
                if a.skip_live:
                    continue
                s = dataclasses.replace(base, key_prefix=f"bench-pools-{layout}-{uuid.uuid4().hex[:6]}")
                row = live_run(s, path, a.jobs, Path(d) / layout)
                print(f"live {layout}: {row}", flush=True)
                delete_prefix(connect(url), Keys(s.key_prefix))
    finally:
        if emb is not None:
            emb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
