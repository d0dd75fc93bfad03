"""A GPU worker's SIGTERM during a job's endpoint start (start_endpoint: a process
endpoint's cold start, a helper endpoint's start, a wake) hands the job's lease back at once.

Before, a start in progress did not look at the shutdown (:data:`makespan.shutdown.SHUTTING_DOWN`):
it waited on its endpoint's health check (or a wake's answer) until the shutdown's watchdog
cut the worker off (exit code 1); the job waited for its lease TTL to expire before it was
requeued, and the endpoint process it spawned was left for the next worker's orphan sweep.
Now the start's pauses see the shutdown (as execute's wait of ``service_s`` does), the start
stops the processes it spawned (a half-woken instance too), and the phase hands the lease
back (requeued, no attempt counted): the worker exits 0 well within its grace period.

1. A real planner and GPU worker process (real Redis), the endpoint a real process
   (:mod:`makespan.workers.endpoint_server`) whose health check passes only after 1000 s:
   the job's own endpoint, or a helper endpoint started beside it.
2. In-process phases (as tests/workers/test_wake_lease_lost.py): a wake of a sleeping
   endpoint process that answers after 1000 s; and a set-point restore, which has nothing
   to hand back: its start runs on at a shutdown, as before.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from makespan import shutdown
from makespan.live import LiveSystem
from makespan.models import load_fleet, parse_fleet
from makespan.producer import Producer
from makespan.workers.drivers import get_driver
from makespan.workers.drivers.registry import instances_on, register_instance, set_instance_state
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import PhaseContext, PhaseRunner, instance_value
from tests.live import all_events, wait_for

HOST = "h1"
SHUTDOWN_GRACE_S = 20.0  # the watchdog's bound: a start that ignores the shutdown is cut off only then
LEASE_TTL_S = 60.0  # far beyond the shutdown: a job queued when the worker exits was handed back, not reclaimed
SLOW_START_S = 100_000  # workload s: a 1000 wall s load of the endpoint server at the time scale 0.01
FLEET = f"""
name = "shutdown-mid-start"
[[hosts]]
name = "{HOST}"
gpu_count = 1
memory_mib = 40000
[endpoints.slow]
model = "slow/model"
memory_mib_per_gpu = 20000
cold_start_s = {SLOW_START_S}
evict_s = 1
[endpoints.slow.launch]
driver = "process"
health_timeout_s = 3000
[endpoints.sim]
model = "sim/model"
memory_mib_per_gpu = 6000
cold_start_s = 1
evict_s = 1
"""


def _alive(pid: int) -> bool:
    """The process runs and is not a zombie (read here, not from the code under test)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize(("started", "pool"), [("endpoint", "threads"), ("helper", "threads"), ("endpoint", "prefork")])
def test_a_sigterm_during_a_start_hands_the_lease_back_and_stops_the_spawned_process(r, keys, settings, tmp_path,
                                                                                     started, pool):
    """``pool`` prefork: the start runs in a pool child, which now sees the worker's
    shutdown (before, the group's SIGTERM ended the child at once, mid-start, and the
    lease waited for its TTL)."""
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet = load_fleet(path)
    gpu = fleet.hosts[0].gpus[0].uuid
    s = dataclasses.replace(settings, shutdown_grace_s=SHUTDOWN_GRACE_S, lease_ttl_s=LEASE_TTL_S)
    system = LiveSystem(path, fleet, s, tmp_path / "logs", pool=pool, observer=False,
                        extra_env={"MAKESPAN_LOG_DIR": str(tmp_path / "endpoints")})
    try:
        system.start()
        spec = {"endpoint": "slow", "service_s": 1} if started == "endpoint" else \
            {"endpoint": "sim", "service_s": 1, "helpers": ["slow"]}
        job = Producer(r, keys, fleet, s).submit(spec).id
        lease = wait_for(lambda: r.hget(keys.job(job), "lease"), 60, "the job's lease")
        starting = wait_for(lambda: [i for i, st in instances_on(r, keys, [gpu], with_state=True)
                                     if i.endpoint == "slow" and st == "starting"], 60,
                            "the slow endpoint's process to be spawned")
        (inst,) = starting
        assert inst.pid and _alive(inst.pid)
        (planner,) = [p for p in system.procs if p.name == "planner-0"]
        os.killpg(planner.popen.pid, signal.SIGTERM)  # no planner: a requeued job stays queued for the checks
        planner.popen.wait(timeout=60)
        assert r.hget(keys.phase(lease), "start_endpoint:claimed") and r.hget(keys.job(job), "state") == "leased"

        (worker,) = [p for p in system.procs if p.name == f"gpu-{HOST}-0"]
        t0 = time.monotonic()
        os.killpg(worker.popen.pid, signal.SIGTERM)
        code = worker.popen.wait(timeout=SHUTDOWN_GRACE_S + 60)
        print(f"seconds from SIGTERM to the worker's exit: {time.monotonic() - t0:.2f} (code {code})")
        assert code == 0, f"the start ran on until the shutdown's watchdog (log: {worker.log_path})"

        # the lease was handed back before the worker exited (its TTL is 60 s): requeued, no attempt counted
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed" and e.get("job") == job]
        assert [(e["outcome"], e.get("cause")) for e in reclaimed] == [("requeued", "worker_shutdown")], reclaimed
        record = r.hgetall(keys.job(job))
        assert record["state"] == "queued" and record["attempts"] == "0", record
        assert r.zscore(keys.queue(record["priority"]), job) is not None
        assert r.zcard(keys.leases) == 0 and not r.exists(keys.gpu(gpu)) and not r.exists(keys.lease(lease))
        # the process the start spawned was stopped, and forgotten
        assert not _alive(inst.pid), f"the endpoint process {inst.pid} of the start outlived the worker"
        assert not r.sismember(keys.instances, inst.id)
    finally:
        system.stop()


GPU = "GPU-h1-0"
IN_PROCESS_FLEET = {
    "name": "shutdown-mid-wake",
    "hosts": [{"name": HOST, "gpu_count": 1, "memory_mib": 81920}],
    "endpoints": {
        # wake_s 100 000 x time scale 0.01 = a 1000 s wake of the bundled endpoint server
        "chat": {"model": "m/chat", "memory_mib_per_gpu": 20000, "cold_start_s": 20, "evict_s": 5,
                 "wake_s": 100_000, "launch": {"driver": "process", "health_path": "/health",
                                               "health_timeout_s": 60}},
        # a simulated restore: a wait of 300 x 0.01 = 3 s
        "sim": {"model": "m/sim", "memory_mib_per_gpu": 20000, "cold_start_s": 300, "evict_s": 1},
    },
}


def _run_in_thread(runner: PhaseRunner, ctx: PhaseContext, phase: str) -> tuple[threading.Thread, list[str]]:
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run(ctx, phase)))
    thread.start()
    return thread, outcome


def test_a_shutdown_during_a_wake_stops_the_half_woken_instance_and_hands_the_lease_back(r, keys, settings,
                                                                                         tmp_path, monkeypatch):
    monkeypatch.setenv("MAKESPAN_LOG_DIR", str(tmp_path))
    settings = dataclasses.replace(settings, heartbeat_s=0.2)
    fleet = parse_fleet(IN_PROCESS_FLEET)
    r.set(keys.fleet, fleet.model_dump_json())
    driver = get_driver("process", log_dir=tmp_path, grace_s=2.0)
    sleeper = driver.start(fleet.endpoints["chat"], [GPU], time_scale=0.01, host=HOST)
    thread = None
    try:
        driver.sleep(sleeper, 1)
        register_instance(r, keys, sleeper)
        set_instance_state(r, keys, sleeper.id, "asleep", sleep_level=1)
        job = Producer(r, keys, fleet, settings).submit({"endpoint": "chat", "service_s": 10}).id
        priority = r.hget(keys.job(job), "priority")
        lease = LeaseStore(r, keys).acquire("L1", (GPU,), settings.lease_ttl_s, job_id=job, kind="job",
                                            holder=HOST, queue=keys.queue(priority))
        assert lease is not None
        ctx = PhaseContext("L1", lease.token, [GPU], HOST, "job", "chat", job, priority, 10.0)
        runner = PhaseRunner(r, settings, fleet)
        assert runner.run(ctx, "evict") == "done"
        thread, outcome = _run_in_thread(runner, ctx, "start_endpoint")
        wait_for(lambda: r.hget(keys.instance(sleeper.id), "state") == "waking" or not thread.is_alive(), 60,
                 "the wake to begin")
        assert thread.is_alive()

        shutdown.SHUTTING_DOWN.set()  # the worker's SIGTERM, as shutdown.arm() sets it
        thread.join(30)  # a bound on a hang only: the wake's answer comes after 1000 s unless abandoned
        assert outcome == ["handed_back"]
        record = r.hgetall(keys.job(job))
        assert record["state"] == "queued" and record["attempts"] == "0", record
        assert not r.exists(keys.lease("L1")) and not r.exists(keys.gpu(GPU))
        reclaimed = [e for e in all_events(r, keys) if e["kind"] == "reclaimed"]
        assert [(e["outcome"], e["cause"]) for e in reclaimed] == [("requeued", "worker_shutdown")]
        # half awake, nothing would track it: stopped and forgotten
        assert sleeper.proc.wait(timeout=10) is not None
        assert not r.sismember(keys.instances, sleeper.id) and not r.exists(keys.resident(GPU))
    finally:
        shutdown.SHUTTING_DOWN.clear()
        if thread is not None and thread.is_alive():  # the code before the fix: the wake runs on
            r.delete(keys.gpu(GPU))  # its lease is lost: the phase ends at its next look
            driver.stop(sleeper)  # the wake's request fails
            thread.join(60)
        driver.stop(sleeper)


def test_a_restore_start_runs_on_at_a_shutdown(r, keys, settings):
    """A set-point restore has no job to hand back: its start is not cut short by the
    shutdown (as before); it completes and leaves its endpoint resident."""
    fleet = parse_fleet(IN_PROCESS_FLEET)
    r.set(keys.fleet, fleet.model_dump_json())
    lease = LeaseStore(r, keys).acquire("R1", (GPU,), settings.lease_ttl_s, kind="restore")
    assert lease is not None
    ctx = PhaseContext("R1", lease.token, [GPU], HOST, "restore", "sim")
    runner = PhaseRunner(r, settings, fleet)
    assert runner.run(ctx, "evict") == "done"
    thread, outcome = _run_in_thread(runner, ctx, "restore")
    try:
        wait_for(lambda: r.hget(keys.phase("R1"), "restore:claimed") or not thread.is_alive(), 30,
                 "the restore to begin")
        shutdown.SHUTTING_DOWN.set()  # inside its 3 s wait
        thread.join(30)
    finally:
        shutdown.SHUTTING_DOWN.clear()
    assert outcome == ["completed"]
    assert r.get(keys.resident(GPU)) == instance_value("sim", [GPU])
    assert not r.exists(keys.lease("R1")) and not r.exists(keys.gpu(GPU))
