"""Scale benchmark: the real queues, planner and GPU worker with no-op workloads and
simulated endpoints, for growing job counts, against Celery's raw no-op throughput on
the same Redis in the same run.

Run: ``.venv/bin/python -m bench.scale --sizes 1000,10000 [--gpus 8] [--redis-url URL] [--modes plain,function]``
(``function``: the jobs are calls of a no-op workload function submitted with
``makespan.connect``'s client, each storing its result).
(without ``--redis-url`` it starts a private redis-server, so memory figures are ours).

The yardstick is Celery as it ships: its worker and publisher use kombu's own Redis
transport and Celery's own worker consumer (``--raw-transport kombu``, the default);
``--raw-transport makespan`` runs it on :mod:`makespan.broker`'s transport and
:mod:`makespan.celery_consumer`'s consumer instead (the live system's: one Redis client
per channel, a burst popped per round trip, acks written once per loop turn, task events
published off the loop), which makes raw Celery itself faster (bench/RESULTS.md).

Per size it prints: jobs/s end to end (first submit → last finish), the ratio to raw
Celery no-op tasks/s (same worker flags, pool and concurrency, same Redis, same
submit-while-draining shape), Redis ``used_memory`` after drain (and its growth over
the empty baseline), peak RSS growth of the planner and of the GPU worker (MiB, over
their RSS once warm), per-job planner cost (planner CPU ms per job), the drain counts of
the planner's last drain check, GPU slot utilization (leased GPU-time ÷ GPU-time) and
idle-while-queued GPU-seconds, both sampled every ``SAMPLE_S``, and CPU ms per job of each
process (planner, GPU worker, observer, this bench process with its submitting thread and
samplers, the Redis server) beside raw Celery's CPU ms per task (worker, bench, Redis).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings
from makespan.workers.retention import state_size, tally_key

SAMPLE_S = 0.02
STOCK_TRANSPORT = "kombu.transport.redis:Transport"  # the raw Celery yardstick's broker transport (--raw-transport kombu)
STOCK_CONSUMER = "celery.worker.consumer:Consumer"  # ... and its worker consumer (makespan.celery_consumer otherwise)
NOOP_QUEUE = "bench.noop"
ENDPOINT = "noop"


def fleet_toml(gpus: int) -> str:
    """One host with ``gpus`` GPUs; a TP-1 no-op endpoint at the set point on each GPU."""
    sp = ", ".join(f'{{ host = "h0", gpus = [{i}] }}' for i in range(gpus))
    return (f'name = "scale"\n[[hosts]]\nname = "h0"\ngpu_count = {gpus}\nmemory_mib = 81920\n'
            f'[endpoints.{ENDPOINT}]\nmodel = "noop"\ntensor_parallel = 1\nmemory_mib_per_gpu = 1000\n'
            f'cold_start_s = 1\nevict_s = 0\nslots = 1\nset_point = [{sp}]\n')


# -- process probes (Linux /proc) ------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sampler:
    """Samples GPU lease keys and queue depths every SAMPLE_S, and process RSS."""

    r: redis.Redis
    keys: Keys
    gpus: list[str]
    pids: dict[str, int]
    busy_s: float = 0.0
    total_s: float = 0.0
    idle_queued_gpu_s: float = 0.0
    rss0: dict[str, float] = field(default_factory=dict)
    rss_peak: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        self.rss0 = {n: rss_mib(p) for n, p in self.pids.items()}
        self.rss_peak = dict(self.rss0)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        gk = [self.keys.gpu(g) for g in self.gpus]
        last = time.monotonic()
        n = 0
        while not self._stop.wait(SAMPLE_S):
            p = self.r.pipeline(transaction=False)
            p.mget(gk)
            for q in self.keys.queues():
                p.zcard(q)
            held, *depths = p.execute()
            now = time.monotonic()
            dt, last = now - last, now
            used = sum(1 for v in held if v)
            self.busy_s += used * dt
            self.total_s += len(gk) * dt
            if sum(depths) > 0:
                self.idle_queued_gpu_s += (len(gk) - used) * dt
            n += 1
            if n % 25 == 0:
                for name, pid in self.pids.items():
                    try:
                        self.rss_peak[name] = max(self.rss_peak[name], rss_mib(pid))
                    except OSError:
                        pass

    def stop(self) -> None:
        self._stop.set()
        self._t.join()
        for name, pid in self.pids.items():
            try:
                self.rss_peak[name] = max(self.rss_peak[name], rss_mib(pid))
            except OSError:
                pass


def _cpu_by_process(pids: dict[str, int], r: redis.Redis) -> dict[str, float]:
    """CPU seconds (user + system) so far of each process in ``pids``, of this bench process
    (``bench``: the submitting thread and the samplers) and of the Redis server when it is
    this machine's (``redis``, from INFO's used_cpu_sys + used_cpu_user)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu_s(pid)
        except OSError:
            out[name] = 0.0
    times = os.times()
    out["bench"] = times.user + times.system
    cpu = r.info("cpu")
    out["redis"] = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
    return out


def _submit_all(prod: Producer, n: int, errors: list, client: Any = None) -> None:
    """``n`` no-op jobs: plain jobs through the Producer, or (``client``) calls of the
    no-op workload function ``bench.noop`` through :class:`makespan.client.Client`."""
    try:
        for _ in range(n):
            if client is not None:
                client.submit("bench.noop", service_s=0.01)
            else:
                prod.submit({"endpoint": ENDPOINT, "service_s": 0.01, "priority": "NORMAL"})
    except Exception as e:  # reported by the caller
        errors.append(e)


def run_makespan(settings: Settings, gpus: int, n_jobs: int, workdir: Path, timeout_s: float = 3600.0,
                 warm_jobs: int = 0, function: bool = False) -> dict[str, Any]:
    """Drain ``n_jobs`` no-op jobs through a live planner + one GPU worker; the figures of
    one size (see module doc). ``function``: the jobs call the no-op workload function
    ``bench.noop`` (submitted with makespan.connect's client, result stored). Keys of
    ``settings.key_prefix`` are left for the caller."""
    if function:
        settings = replace(settings, workload_modules="bench.noop_fns")
    workdir.mkdir(parents=True, exist_ok=True)
    fleet_path = workdir / "fleet.toml"
    fleet_path.write_text(fleet_toml(gpus))
    fleet = load_fleet(fleet_path)
    r = connect(settings.redis_url)
    keys = Keys(settings.key_prefix)
    live = LiveSystem(fleet_path, fleet, settings, workdir / "logs")
    live.start(wait_s=120)
    try:
        prod = Producer(r, keys, fleet, settings)
        client = None
        if function:
            from makespan.client import Client

            client = Client(r, settings, fleet)
            wait_for(lambda: r.exists(keys.fn_live("bench.noop")), 60, "the no-op function to be published")
        pids = {p.name.split("-")[0]: p.popen.pid for p in live.procs}
        # warm up: set points restored, one job through every process, then baselines
        wait_for(lambda: r.hget(keys.drain, "checks"), 60, "first drain check")
        _submit_all(prod, max(warm_jobs, gpus), [], client)
        wait_for(lambda: state_size(r, keys)["completed"] >= max(warm_jobs, gpus), 60, "warm-up jobs")
        base_done = state_size(r, keys)["completed"]
        mem0 = int(r.info("memory")["used_memory"])
        cpu0 = cpu_s(pids["planner"])
        cpu_by_process0 = _cpu_by_process(pids, r)
        checks0 = int(r.hget(keys.drain, "checks") or 0)
        gpu_ids = [g.uuid for h in fleet.hosts for g in h.gpus]
        samp = Sampler(r, keys, gpu_ids, pids).start()
        errors: list = []
        t0 = time.time()
        th = threading.Thread(target=_submit_all, args=(prod, n_jobs, errors, client), daemon=True)
        th.start()
        th.join()
        submit_s = time.time() - t0
        if errors:
            raise errors[0]
        done = lambda: sum(state_size(r, keys)[s] for s in ("completed", "failed", "cancelled")) - base_done  # noqa: E731
        wait_for(lambda: done() >= n_jobs, timeout_s, f"{n_jobs} jobs to finish", poll_s=0.2)
        last = float(r.hget(tally_key(keys), "last_finished_s"))
        samp.stop()
        cpu1 = cpu_s(pids["planner"])
        cpu_by_process1 = _cpu_by_process(pids, r)
        wait_for(lambda: int(r.hget(keys.drain, "checks") or 0) > checks0, 60, "drain check after the run")
        time.sleep(max(settings.retention_sweep_s, settings.planner_tick_s) * 3)  # a few idle sweeps
        size = state_size(r, keys)
        mem1 = int(r.info("memory")["used_memory"])
        drain = {k: int(v) for k, v in r.hgetall(keys.drain).items() if k in ("leases", "agenda_entries", "busy_slots")}
        elapsed = last - t0
        return {
            "jobs": n_jobs, "completed": size["completed"] - base_done, "failed": size["failed"],
            "jobs_per_s": n_jobs / elapsed, "elapsed_s": elapsed, "submit_per_s": n_jobs / submit_s,
            "redis_used_memory_mib": mem1 / 2**20, "redis_growth_mib": (mem1 - mem0) / 2**20,
            "rss_growth_mib": {k: samp.rss_peak[k] - samp.rss0[k] for k in samp.rss0},
            "planner_cpu_ms_per_job": 1000 * (cpu1 - cpu0) / n_jobs,
            "cpu_ms_per_job": {k: 1000 * (cpu_by_process1[k] - cpu_by_process0[k]) / n_jobs for k in cpu_by_process0},
            "drain": drain, "state": size,
            "utilization": samp.busy_s / samp.total_s if samp.total_s else 0.0,
            "idle_while_queued_gpu_s": samp.idle_queued_gpu_s, "gpu_s": samp.total_s,
        }
    finally:
        live.stop()
        r.close()


# -- the yardstick: Celery's raw no-op task on the same Redis ---------------------------
def _noop_app():
    from makespan.celery_app import create_celery

    s = Settings.from_env()
    app = create_celery(s)
    app.conf.include = []
    if os.environ.get("MAKESPAN_BENCH_RAW_TRANSPORT", "kombu") == "kombu":  # Celery as it ships (module doc)
        app.conf.broker_transport = STOCK_TRANSPORT
        app.conf.worker_consumer = STOCK_CONSUMER
    counter = f"{s.key_prefix}:bench:noop_done"
    client: list[redis.Redis] = []

    @app.task(name="bench.noop", ignore_result=True, acks_late=True)
    def noop() -> None:
        if not client:
            client.append(connect(s.redis_url))
        client[0].incr(counter)

    app.noop = noop  # type: ignore[attr-defined]
    app.counter = counter  # type: ignore[attr-defined]
    return app


noop_app = _noop_app() if os.environ.get("MAKESPAN_BENCH_NOOP") == "1" else None


def run_raw_celery(settings: Settings, concurrency: int, n_tasks: int, workdir: Path,
                   transport: str = "kombu") -> dict[str, Any]:
    """Raw Celery: ``n_tasks`` no-op tasks (each one INCR) submitted while one worker
    (threads pool, ``concurrency``, -E, the makespan Celery config) drains them.
    ``transport``: ``kombu`` (kombu's own Redis transport, Celery as it ships) or
    ``makespan`` (:mod:`makespan.broker`'s, which the live system uses)."""
    os.environ["MAKESPAN_BENCH_RAW_TRANSPORT"] = transport  # this process's publisher and the worker's
    env = {**os.environ, **settings.to_env(), "MAKESPAN_BENCH_NOOP": "1", "PYTHONUNBUFFERED": "1"}
    log = open(workdir / "noop-worker.log", "ab")
    w = subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.scale:noop_app", "worker", "-Q", NOOP_QUEUE,
                          "-P", "threads", "-c", str(concurrency), "-E", "--without-gossip", "--without-mingle",
                          "--loglevel", "WARNING", "-n", f"noop-{uuid.uuid4().hex[:6]}@%h"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    os.environ["MAKESPAN_BENCH_NOOP"] = "1"
    saved = {k: os.environ.get(k) for k in settings.to_env()}
    os.environ.update(settings.to_env())
    try:
        app = _noop_app()
        r = connect(settings.redis_url)
        wait_for(lambda: app.control.ping(timeout=0.5), 60, "no-op worker")
        for _ in range(50):
            app.noop.apply_async(queue=NOOP_QUEUE)
        wait_for(lambda: int(r.get(app.counter) or 0) >= 50, 60, "no-op warm-up")
        r.set(app.counter, 0)
        cpu0 = _cpu_by_process({"worker": w.pid}, r)
        t0 = time.time()
        for _ in range(n_tasks):
            app.noop.apply_async(queue=NOOP_QUEUE)
        wait_for(lambda: int(r.get(app.counter) or 0) >= n_tasks, 3600, "no-op tasks", poll_s=0.01)
        el = time.time() - t0
        cpu1 = _cpu_by_process({"worker": w.pid}, r)
        app.close()
        return {"tasks": n_tasks, "tasks_per_s": n_tasks / el, "elapsed_s": el,
                "cpu_ms_per_task": {k: 1000 * (cpu1[k] - cpu0[k]) / n_tasks for k in cpu0}}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.killpg(w.pid, 15)
        w.wait(timeout=30)
        log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--redis-url", default=None, help="default: a private embedded redis-server")
    ap.add_argument("--raw-tasks", type=int, default=20000, help="raw Celery tasks per size (capped at the size)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--raw-transport", default="kombu", choices=("kombu", "makespan"),
                    help="the raw Celery yardstick's broker transport: kombu's own (Celery as it ships; default) "
                         "or makespan.broker's (the live system's: it reuses one Redis client per channel)")
    ap.add_argument("--plan-follow-s", type=float, default=Settings.plan_follow_s,
                    help="Settings.plan_follow_s of the live planner (0: re-plan at every tick)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--policy", default="default", help="live planner policy (default: the live default, `default`)")
    ap.add_argument("--modes", default="plain", help="comma list: plain (jobs without a function: execute sleeps "
                                                     "service_s) and/or function (calls of a no-op workload function)")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"plain", "function"}:
        ap.error("--modes: use plain and/or function")
    emb = None
    url = a.redis_url
    if url is None:
        emb = start_embedded()
        url = emb.url
    rows = []
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            prefix = f"bench-scale-{uuid.uuid4().hex[:8]}"
            s = Settings(redis_url=url, key_prefix=prefix, time_scale=1e-4, lease_ttl_s=10.0, heartbeat_s=2.0,
                         batch_size=a.batch_size, planner_tick_s=0.02, retention_sweep_s=0.2, policy=a.policy,
                         plan_follow_s=a.plan_follow_s)
            with tempfile.TemporaryDirectory(prefix="scale-") as d:
                raw = run_raw_celery(replace(s, key_prefix=prefix + "-raw"), a.gpus, min(n, a.raw_tasks), Path(d),
                                     a.raw_transport)
                delete_prefix(connect(url), Keys(prefix + "-raw"))
                for mode in modes:
                    ours = run_makespan(replace(s, key_prefix=f"{prefix}-{mode}"), a.gpus, n, Path(d) / mode,
                                        function=mode == "function")
                    ours["mode"] = mode
                    ours["raw_celery_tasks_per_s"] = raw["tasks_per_s"]
                    ours["raw_celery_cpu_ms_per_task"] = raw["cpu_ms_per_task"]
                    ours["raw_transport"] = a.raw_transport
                    ours["ratio_to_raw"] = ours["jobs_per_s"] / raw["tasks_per_s"]
                    rows.append(ours)
                    _print_row(ours)
                    delete_prefix(connect(url), Keys(f"{prefix}-{mode}"))
    finally:
        if emb is not None:
            emb.stop()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0


def _print_row(o: dict[str, Any]) -> None:
    print(f"mode={o.get('mode', 'plain')} jobs={o['jobs']} completed={o['completed']} jobs/s={o['jobs_per_s']:.1f} "
          f"raw_celery/s={o['raw_celery_tasks_per_s']:.1f} ratio={o['ratio_to_raw']:.2f} "
          f"redis_used_mib={o['redis_used_memory_mib']:.1f} (growth {o['redis_growth_mib']:+.1f}) "
          f"rss_growth_mib={ {k: round(v, 1) for k, v in o['rss_growth_mib'].items()} } "
          f"planner_cpu_ms/job={o['planner_cpu_ms_per_job']:.3f} drain={o['drain']} "
          f"util={o['utilization']:.3f} idle_while_queued_gpu_s={o['idle_while_queued_gpu_s']:.2f}"
          f"/{o['gpu_s']:.1f}", flush=True)

    def ms(d: dict[str, float]) -> str:
        return " ".join(f"{k}={v:.2f}" for k, v in d.items()) + f" total={sum(d.values()):.2f}"
    print(f"  cpu ms/job: {ms(o['cpu_ms_per_job'])} | raw Celery cpu ms/task: {ms(o['raw_celery_cpu_ms_per_task'])}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
